package protobuf

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// SchemaText returns the .proto text of fd as the registry stores a
// Protobuf schema: its syntax, package, imports, messages (fields, maps,
// oneofs, nested messages and enums) and enums, with type names fully
// qualified; options and comments are left out, as they do not change
// the wire format. Imports are printed as they are: [Codec.Encode]
// registers each imported file (but Protobuf's well-known types, which the
// registry knows) as a schema reference. It fails for a file of an
// editions syntax.
func SchemaText(fd protoreflect.FileDescriptor) (string, error) {
	var b strings.Builder
	switch fd.Syntax() {
	case protoreflect.Proto2:
		b.WriteString("syntax = \"proto2\";\n")
	case protoreflect.Proto3:
		b.WriteString("syntax = \"proto3\";\n")
	default:
		return "", fmt.Errorf("%s: syntax %s is not supported", fd.Path(), fd.Syntax())
	}
	if fd.Package() != "" {
		fmt.Fprintf(&b, "package %s;\n", fd.Package())
	}
	imps := fd.Imports()
	for i := range imps.Len() {
		fmt.Fprintf(&b, "import %q;\n", imps.Get(i).Path())
	}
	msgs := fd.Messages()
	for i := range msgs.Len() {
		b.WriteByte('\n')
		printMessage(&b, msgs.Get(i), "", fd.Syntax())
	}
	enums := fd.Enums()
	for i := range enums.Len() {
		b.WriteByte('\n')
		printEnum(&b, enums.Get(i), "")
	}
	return b.String(), nil
}

func printMessage(b *strings.Builder, m protoreflect.MessageDescriptor, indent string, syntax protoreflect.Syntax) {
	fmt.Fprintf(b, "%smessage %s {\n", indent, m.Name())
	in := indent + "  "
	fields := m.Fields()
	printed := map[protoreflect.Name]bool{}
	for i := range fields.Len() {
		f := fields.Get(i)
		if printed[f.Name()] {
			continue
		}
		if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
			fmt.Fprintf(b, "%soneof %s {\n", in, o.Name())
			ofs := o.Fields()
			for j := range ofs.Len() {
				printField(b, ofs.Get(j), in+"  ", syntax, true)
				printed[ofs.Get(j).Name()] = true
			}
			fmt.Fprintf(b, "%s}\n", in)
			continue
		}
		printField(b, f, in, syntax, false)
	}
	nested := m.Messages()
	for i := range nested.Len() {
		if n := nested.Get(i); !n.IsMapEntry() {
			printMessage(b, n, in, syntax)
		}
	}
	enums := m.Enums()
	for i := range enums.Len() {
		printEnum(b, enums.Get(i), in)
	}
	fmt.Fprintf(b, "%s}\n", indent)
}

func printField(b *strings.Builder, f protoreflect.FieldDescriptor, indent string, syntax protoreflect.Syntax, inOneof bool) {
	label := ""
	switch {
	case f.IsMap():
		fmt.Fprintf(b, "%smap<%s, %s> %s = %d;\n", indent, typeName(f.MapKey()), typeName(f.MapValue()), f.Name(), f.Number())
		return
	case inOneof:
	case f.Cardinality() == protoreflect.Repeated:
		label = "repeated "
	case f.Cardinality() == protoreflect.Required:
		label = "required "
	case syntax == protoreflect.Proto2 || f.HasOptionalKeyword():
		label = "optional "
	}
	fmt.Fprintf(b, "%s%s%s %s = %d;\n", indent, label, typeName(f), f.Name(), f.Number())
}

func typeName(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return "." + string(f.Message().FullName())
	case protoreflect.EnumKind:
		return "." + string(f.Enum().FullName())
	}
	return f.Kind().String()
}

func printEnum(b *strings.Builder, e protoreflect.EnumDescriptor, indent string) {
	fmt.Fprintf(b, "%senum %s {\n", indent, e.Name())
	vals := e.Values()
	for i := range vals.Len() {
		v := vals.Get(i)
		fmt.Fprintf(b, "%s  %s = %d;\n", indent, v.Name(), v.Number())
	}
	fmt.Fprintf(b, "%s}\n", indent)
}
