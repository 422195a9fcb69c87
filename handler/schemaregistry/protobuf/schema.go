package protobuf

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// indexKey is the map key of message indexes.
func indexKey(idx []int) string {
	var b strings.Builder
	for i, n := range idx {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// messageNames reads a Protobuf schema as a registry holds it and returns
// the full name of each message it declares, by its message indexes
// (indexKey). The schema is .proto text, or (as Confluent's serializers
// register it) a base64-encoded FileDescriptorProto.
func messageNames(schema string) (map[string]protoreflect.FullName, error) {
	if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(schema)); err == nil {
		var fd descriptorpb.FileDescriptorProto
		if proto.Unmarshal(b, &fd) == nil && fd.GetName() != "" {
			names := map[string]protoreflect.FullName{}
			var walk func(prefix string, idx []int, msgs []*descriptorpb.DescriptorProto)
			walk = func(prefix string, idx []int, msgs []*descriptorpb.DescriptorProto) {
				for i, m := range msgs {
					name, at := m.GetName(), append(append([]int(nil), idx...), i)
					if prefix != "" {
						name = prefix + "." + name
					}
					names[indexKey(at)] = protoreflect.FullName(name)
					walk(name, at, m.GetNestedType())
				}
			}
			walk(fd.GetPackage(), nil, fd.GetMessageType())
			return names, nil
		}
	}
	return textMessageNames(schema)
}

// textMessageNames reads a .proto file's text and returns the full name of
// each message it declares, by its message indexes (indexKey). It reads
// only what names messages (the package, message declarations and the
// braces around them); it fails on text whose braces do not balance.
func textMessageNames(text string) (map[string]protoreflect.FullName, error) {
	toks := tokens(text)
	names := map[string]protoreflect.FullName{}
	type scope struct {
		message bool
		name    string // full name of a message scope
		idx     []int  // its indexes
		count   int    // messages declared in it so far
	}
	stack := []scope{{message: true}} // the file: messages at its top level count
	pkg := ""
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		atStart := i == 0 || toks[i-1] == ";" || toks[i-1] == "{" || toks[i-1] == "}"
		switch {
		case t == "package" && atStart && i+1 < len(toks):
			pkg = toks[i+1]
		case t == "message" && atStart && i+2 < len(toks) && toks[i+2] == "{":
			top := &stack[len(stack)-1]
			if !top.message {
				return nil, fmt.Errorf("reading the protobuf schema: message %s inside a block that is not a message", toks[i+1])
			}
			name := toks[i+1]
			switch {
			case top.name != "":
				name = top.name + "." + name
			case pkg != "":
				name = pkg + "." + name
			}
			idx := append(append([]int(nil), top.idx...), top.count)
			top.count++
			names[indexKey(idx)] = protoreflect.FullName(name)
			stack = append(stack, scope{message: true, name: name, idx: idx})
			i += 2
		case t == "{":
			stack = append(stack, scope{})
		case t == "}":
			if len(stack) == 1 {
				return nil, fmt.Errorf("reading the protobuf schema: unbalanced '}'")
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) != 1 {
		return nil, fmt.Errorf("reading the protobuf schema: unclosed '{'")
	}
	return names, nil
}

// tokens splits .proto text into identifiers (with dots), strings,
// numbers and punctuation, leaving out comments and whitespace.
func tokens(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case strings.HasPrefix(s[i:], "//"):
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case strings.HasPrefix(s[i:], "/*"):
			end := strings.Index(s[i+2:], "*/")
			if end < 0 {
				return out
			}
			i += end + 4
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			out = append(out, "\"str\"")
			i = j + 1
		case isIdent(c):
			j := i
			for j < len(s) && (isIdent(s[j]) || s[j] == '.') {
				j++
			}
			out = append(out, s[i:j])
			i = j
		default:
			out = append(out, string(c))
			i++
		}
	}
	return out
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
