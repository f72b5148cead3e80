package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/idemkv/idem"
)

func runCanon(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("canon", flag.ContinueOnError)
	fs.SetOutput(stderr)
	profile := fs.String("profile", "exact", "number profile: exact (decimal value) or jcs (RFC 8785, IEEE doubles)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem canon [--profile exact|jcs] [FILE]

Prints the canonical form of the JSON document in FILE (or standard input,
also when FILE is "-"), with no trailing newline: the bytes a fingerprint
hashes for a JSON body.

Reference: `+docsURL("docs/canonical.md")+`

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	p, err := idem.ParseProfile(*profile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if fs.NArg() > 1 {
		fmt.Fprintln(stderr, "idem canon: at most one FILE")
		fs.Usage()
		return 2
	}
	name, src, err := readInput(fs.Arg(0), stdin)
	if err != nil {
		fmt.Fprintf(stderr, "idem canon: %v\n", err)
		return 1
	}
	out, err := idem.Canonicalize(src, idem.CanonicalOptions{Profile: p})
	if err != nil {
		fmt.Fprintf(stderr, "idem canon: %s\n", describe(name, src, err))
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintf(stderr, "idem canon: %v\n", err)
		return 1
	}
	return 0
}

// parseStatus turns a flag parsing error into an exit status: asking for
// help is not a mistake.
func parseStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// readInput reads the named file, or stdin for "" and "-", and returns
// the name to use in messages.
func readInput(path string, stdin io.Reader) (string, []byte, error) {
	if path == "" || path == "-" {
		b, err := io.ReadAll(stdin)
		return "<stdin>", b, err
	}
	b, err := os.ReadFile(path)
	return path, b, err
}

// describe says where a body error is as name:line:column, which is how a
// person finds it in an editor, and keeps the byte offset and code for
// scripts.
func describe(name string, src []byte, err error) string {
	var be *idem.BodyError
	if !errors.As(err, &be) {
		return fmt.Sprintf("%s: %v", name, err)
	}
	off := min(be.Offset, len(src))
	line := 1 + bytes.Count(src[:off], []byte("\n"))
	col := 1 + off - (bytes.LastIndexByte(src[:off], '\n') + 1)
	return fmt.Sprintf("%s:%d:%d: %s (%s at byte %d)", name, line, col, be.Detail, be.Code, be.Offset)
}
