-- Which scope each handler of a consumer group uses on a topic. The consumer
-- writes a row per (group, topic, route) when it starts and refuses to start
-- when a member brings another scope for the same (group, topic, route): a
-- handler renamed without handler.WithScope would claim its keys in a new
-- scope while members of the old one still run, and every key would be
-- applied twice. route is '' for a handler; for a handler chosen by a
-- handler.Router it is the routed type ('deposit', or 'outer/inner' through
-- nested routers). handler is the name that last recorded the row;
-- first_seen is when the scope was first recorded, last_seen when a member
-- last started with it. {{.Scopes}} is the sanitized, possibly
-- schema-qualified identifier: the guard table's name with the suffix
-- "_scopes".
create table {{.Scopes}} (
    consumer_group text        not null,
    topic          text        not null,
    route          text        not null,
    scope          text        not null,
    handler        text        not null,
    first_seen     timestamptz not null default now(),
    last_seen      timestamptz not null default now(),
    primary key (consumer_group, topic, route)
);
