// Package shippb holds the shipping example's Protobuf messages, generated
// from shipping.proto by protoc-gen-go. Regenerate with go generate (node
// and npm on PATH: buf comes from npm, protoc-gen-go at go.mod's version).
package shippb

//go:generate sh -c "GOBIN=$PWD/.bin go install google.golang.org/protobuf/cmd/protoc-gen-go && PATH=$PWD/.bin:$PATH npx --yes @bufbuild/buf@1.75.0 generate && rm -rf .bin"
