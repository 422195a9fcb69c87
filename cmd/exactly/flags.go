package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
)

// usageError is a command line a command refused while parsing its flags
// (an unknown flag, a bad value): run prints output (the flag package's
// message and the command's usage) on stderr and exits 2.
type usageError struct {
	err    error
	output string
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// parseFlags parses args with fs. For -h and -help it writes the
// command's usage on stdout and returns flag.ErrHelp (run exits 0); for a
// bad flag it returns a *usageError carrying the message and the usage
// for stderr. Afterwards fs writes to stdout again (a command that prints
// its usage itself, for a missing argument, prints it there).
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(stdout)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		_, _ = stdout.Write(buf.Bytes())
		return err
	}
	return &usageError{err: err, output: buf.String()}
}
