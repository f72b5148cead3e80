package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/idemkv/idem"
)

func runFingerprint(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fingerprint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var r idem.Request
	fs.StringVar(&r.Method, "method", "", "HTTP method, as sent (required)")
	fs.StringVar(&r.Path, "path", "", "request path as the service routes it (required)")
	fs.StringVar(&r.Tenant, "tenant", "", "tenant the request was made for (required; may be empty)")
	fs.StringVar(&r.ContentType, "content-type", "application/json", "Content-Type header of the request")
	fs.StringVar(&r.ContentEncoding, "content-encoding", "", "Content-Encoding header of the request; FILE then holds the body as sent, still encoded")
	fs.BoolVar(&r.Raw, "raw", false, "hash the body as its raw bytes, as idem proxy does with a JSON or form body that cannot be canonicalized (and idemhttp with Options.RawFallback)")
	profile := fs.String("profile", "exact", "number profile: exact or jcs")
	var volatile []string
	fs.Func("volatile", "JSON Pointers of members to ignore, comma-separated; may be repeated", func(v string) error {
		for p := range strings.SplitSeq(v, ",") {
			if p != "" {
				volatile = append(volatile, p)
			}
		}
		return nil
	})
	showBody := fs.Bool("show-body", false, "also print the canonical body that is hashed, after the fingerprint")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem fingerprint --method M --path P --tenant T [--content-type CT]
                        [--content-encoding CE] [--volatile PTR,...] [--profile exact|jcs]
                        [--raw] [--show-body] [FILE]

Prints the request fingerprint (hex SHA-256) for the body in FILE (or
standard input, also when FILE is "-"). Two requests that share an
idempotency key must print the same line; if a retry got 422, compare the
two with --show-body.

Reference: `+docsURL("docs/canonical.md")+`

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"method", "path", "tenant"} {
		if !set[name] {
			fmt.Fprintf(stderr, "idem fingerprint: --%s is required\n", name)
			fs.Usage()
			return 2
		}
	}
	if fs.NArg() > 1 {
		fmt.Fprintln(stderr, "idem fingerprint: at most one FILE")
		fs.Usage()
		return 2
	}
	p, err := idem.ParseProfile(*profile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	o := idem.CanonicalOptions{Profile: p, Volatile: volatile}
	name, body, err := readInput(fs.Arg(0), stdin)
	if err != nil {
		fmt.Fprintf(stderr, "idem fingerprint: %v\n", err)
		return 1
	}
	r.Body = body
	fp, err := r.Fingerprint(o)
	if err != nil {
		fmt.Fprintf(stderr, "idem fingerprint: %s\n", describe(name, body, err))
		if !errors.As(err, new(*idem.BodyError)) {
			return 2 // the body was fine; the flags were not
		}
		return 1
	}
	fmt.Fprintln(stdout, fp)
	if *showBody {
		canonical, err := r.CanonicalBody(o)
		if err != nil {
			fmt.Fprintf(stderr, "idem fingerprint: %s\n", describe(name, body, err))
			return 1
		}
		fmt.Fprintf(stdout, "%s\n", canonical)
	}
	return 0
}
