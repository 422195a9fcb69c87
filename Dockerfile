# Builds one of the example services: docker build --build-arg SERVICE=credit .
# (docker-compose.yml builds examples/credit and examples/notify from it).
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
ARG SERVICE=credit
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/service ./examples/${SERVICE}

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/service /service
USER nonroot:nonroot
ENTRYPOINT ["/service"]
