// Package deploy holds no code: its directory keeps the operator's files
// (Prometheus alert rules and their unit tests, the Grafana dashboard and
// the provisioning docker-compose.yml mounts), and its tests check them:
// promtool validates and unit-tests the rules, every metric the rules and
// the dashboard query is one a running service exports (scraped from a
// real consumer.Service), and every file docker-compose.yml mounts exists.
package deploy
