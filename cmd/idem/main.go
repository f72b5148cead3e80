// Command idem is the idempotency toolbox: run `idem help` for the list of
// subcommands.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// A command is one subcommand. run gets the arguments after the
// subcommand's name and returns the exit status: 0 success, 1 failure,
// 2 bad usage. Each lives in its own file and parses its own flags.
type command struct {
	summary string
	run     func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

// commands is the whole command line: adding a subcommand is one file and
// one line here.
var commands = map[string]command{
	"canon":       {"print the canonical form of a JSON document", runCanon},
	"check":       {"verify that records, index entries and body chunks agree", runCheck},
	"clock":       {"show the store's clock mark beside the clock, or --reset it", runClock},
	"compact":     {"delete expired records and return their space to the disk now", runCompact},
	"fingerprint": {"print the fingerprint of a request, to see why a retry got 422", runFingerprint},
	"get":         {"show one record in full, or only its stored response body", runGet},
	"inspect":     {"list records by tenant, endpoint, state and age", runInspect},
	"keygen":      {"print new idempotency keys (uuid4, uuid7, ulid, token)", runKeygen},
	"migrate":     {"bring a PostgreSQL store's schema up to date, or --check it", runMigrate},
	"proxy":       {"put idempotency keys in front of an HTTP service in any language", runProxy},
	"resolve":     {"settle a stuck or unknown record as released, unknown or completed", runResolve},
	"stats":       {"summarize the store: records by state, stuck work, disk, health", runStats},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch name := args[0]; name {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	default:
		cmd, ok := commands[name]
		if !ok {
			fmt.Fprintf(stderr, "idem: unknown command %q\n\n", name)
			usage(stderr)
			return 2
		}
		return cmd.run(args[1:], stdin, stdout, stderr)
	}
}

func usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: idem <command> [arguments]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(&b, "  %-12s %s\n", name, commands[name].summary)
	}
	b.WriteString("\nRun 'idem <command> --help' for a command's flags. Documentation: " + docsURL("README.md") + "\n")
	io.WriteString(w, b.String())
}

// docsURL names a page (and anchor) of idem's documentation by its path
// in the repository: docs/ holds each command's full reference, and the
// --help texts point there instead of repeating it.
func docsURL(path string) string {
	return "https://github.com/idemkv/idem/blob/main/" + path
}
