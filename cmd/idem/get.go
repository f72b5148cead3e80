package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idemkv/idem"
)

func runGet(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store")
	store.addAdmin()
	scope := scopeFlags(fs)
	body := fs.Bool("body", false, "print only the stored response body, byte for byte")
	asJSON := fs.Bool("json", false, "print the record as one JSON object, body included")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem get [--data DIR | --store DSN | --admin URL] [--tenant T] --endpoint E --key K
                [--body | --json]

Prints one record in full: its state, fingerprint, times, attempts and the
stored response (status, headers, body length and digest). With --body,
only the response body, exactly as a replay sends it; with --json, the
whole record, the body as a string when it is UTF-8 text.

A record past its TTL counts as absent, as it does for every request.

Reference: `+docsURL("docs/operating.md")+`

`+toolStoreRule+"\n"+adminToolRule+"\n")
		fs.PrintDefaults()
	}
	if code, done := store.parseTool(fs, args, stderr); done {
		return code
	}
	if err := checkScope(scope); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if *body && *asJSON {
		return usageError(fs, stderr, "--body and --json cannot be combined")
	}
	db, code := store.openTools("get", false, stderr)
	if db == nil {
		return code
	}
	rec, err := db.Get(context.Background(), *scope)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		fmt.Fprintf(stderr, "idem get: no record for key hash %s (tenant %q, endpoint %q); it never existed, was released, or expired\n",
			idem.KeyHash(scope.Key), scope.Tenant, scope.Endpoint)
		return closeStore("get", db, 1, stderr)
	case err != nil:
		fmt.Fprintf(stderr, "idem get: %v\n", err)
		return closeStore("get", db, 1, stderr)
	}
	now := time.Now()
	switch {
	case *body:
		if rec.BodyOmitted {
			fmt.Fprintf(stderr, "idem get: the body (%d bytes) was too large to store; only its length and digest were kept\n", rec.BodyLen)
			return closeStore("get", db, 1, stderr)
		}
		stdout.Write(rec.Response.Body)
	case *asJSON:
		v := viewOf(rec, true, now)
		v.Header = rec.Response.Header
		if rec.State == idem.StateCompleted && !rec.BodyOmitted {
			b := string(rec.Response.Body)
			v.Body = &b // encoding/json replaces bytes that are not UTF-8
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(v)
	default:
		printRecord(stdout, rec, now)
	}
	return closeStore("get", db, 0, stderr)
}

// printRecord shows one record as aligned "name: value" lines.
func printRecord(w io.Writer, rec *idem.Record, now time.Time) {
	line := func(name, format string, a ...any) {
		fmt.Fprintf(w, "%-13s "+format+"\n", append([]any{name + ":"}, a...)...)
	}
	when := func(t time.Time) string {
		return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), relative(t.Sub(now)))
	}
	line("tenant", "%s", cell(rec.Scope.Tenant))
	line("endpoint", "%s", cell(rec.Scope.Endpoint))
	line("key", "%s", cell(rec.Scope.Key))
	line("key hash", "%s", idem.KeyHash(rec.Scope.Key))
	line("state", "%s", rec.State)
	line("fingerprint", "%s", rec.Fingerprint)
	line("created", "%s", when(rec.CreatedAt))
	line("updated", "%s", when(rec.UpdatedAt))
	line("lease until", "%s", when(rec.LeaseUntil))
	line("expires", "%s", when(rec.ExpiresAt))
	line("attempts", "%d", rec.Attempts)
	if rec.State != idem.StateCompleted {
		return
	}
	line("status", "%d", rec.Response.Status)
	for _, k := range slices.Sorted(maps.Keys(rec.Response.Header)) {
		line("header", "%s: %s", k, strings.Join(rec.Response.Header[k], ", "))
	}
	omitted := ""
	if rec.BodyOmitted {
		omitted = ", not stored: too large"
	}
	line("body", "%d bytes, sha256 %x%s", rec.BodyLen, rec.BodyDigest, omitted)
}

// relative says how far a time is from now, as "in 5m00s" or "3h02m ago".
func relative(d time.Duration) string {
	if d < 0 {
		return age(-d) + " ago"
	}
	return "in " + age(d)
}
