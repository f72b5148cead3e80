package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/idemkv/idem"
)

// headerFlags collects repeated --header "Name: value" flags.
type headerFlags http.Header

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") || strings.ContainsAny(value, "\r\n") {
		return fmt.Errorf("want \"Name: value\", got %q", s)
	}
	http.Header(h).Add(textproto.CanonicalMIMEHeaderKey(name), strings.TrimSpace(value))
	return nil
}

func runResolve(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store")
	scope := scopeFlags(fs)
	as := fs.String("as", "", "the real outcome: released, unknown or completed (required)")
	status := fs.Int("status", 0, "with --as completed: the HTTP status the operation really answered (required)")
	bodyFile := fs.String("body-file", "", "with --as completed: file holding the response body to replay (- for standard input)")
	header := headerFlags{}
	fs.Var(header, "header", `with --as completed: a response header to replay, "Name: value" (repeatable)`)
	reason := fs.String("reason", "", "why, for the log: a ticket number, the provider's answer")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem resolve [--data DIR | --store DSN] [--tenant T] --endpoint E --key K
                    --as released|unknown|completed [--status N]
                    [--body-file F] [--header "Name: value"]... [--reason TEXT]

Settles a record whose outcome is stuck: in progress past its lease (the
process that claimed it died), unknown (it may have taken effect) or
failed. Find out first what really happened, from the business records or
the payment provider, then say so:

  --as released   it provably did not happen: the key is freed and the
                  client's next retry runs the operation again
  --as unknown    still not known: retries keep getting 409 outcome_pending
  --as completed  it happened: retries replay --status, --header and
                  --body-file from now on

A completed record is never overwritten, and a claim whose lease is still
running is left alone. Every resolution is logged to standard error as a
structured line.

`+toolStoreRule+"\n")
		fs.PrintDefaults()
	}
	if code, done := store.parseTool(fs, args, stderr); done {
		return code
	}
	if err := checkScope(scope); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	completed := *as == "completed"
	switch {
	case *as != "released" && *as != "unknown" && !completed:
		return usageError(fs, stderr, "--as %q: want released, unknown or completed", *as)
	case completed && (*status < 100 || *status > 999):
		return usageError(fs, stderr, "--as completed needs --status between 100 and 999")
	case !completed && (*status != 0 || *bodyFile != "" || len(header) > 0):
		return usageError(fs, stderr, "--status, --body-file and --header go with --as completed only")
	}
	var resp idem.Response
	if completed {
		resp = idem.Response{Status: *status, Header: http.Header(header)}
		if *bodyFile != "" {
			_, b, err := readInput(*bodyFile, stdin)
			if err != nil {
				fmt.Fprintf(stderr, "idem resolve: %v\n", err)
				return 1
			}
			resp.Body = b
		}
	}

	db, code := store.openTool("resolve", true, stderr)
	if db == nil {
		return code
	}
	ctx := context.Background()
	// Read first so that the log says what the record was before: the
	// takeover makes it in progress under a new lease.
	prev, err := db.Get(ctx, *scope)
	var lease idem.Lease
	if err == nil {
		lease, err = db.TakeOver(ctx, *scope)
	}
	var ke *idem.KeyError
	switch {
	case errors.Is(err, idem.ErrNotFound):
		fmt.Fprintf(stderr, "idem resolve: no record for key hash %s (tenant %q, endpoint %q); nothing to resolve\n",
			idem.KeyHash(scope.Key), scope.Tenant, scope.Endpoint)
		return closeStore("resolve", db, 1, stderr)
	case errors.Is(err, idem.ErrCompleted):
		fmt.Fprintln(stderr, "idem resolve: the record is completed; its response is what every retry replays and is never overwritten")
		return closeStore("resolve", db, 1, stderr)
	case errors.As(err, &ke) && errors.Is(err, idem.ErrInProgress):
		fmt.Fprintf(stderr, "idem resolve: the record is in progress and its lease runs for another %s; the process that claimed it may still finish it. If that process is gone, run this again after the lease ends.\n", age(ke.RetryAfter))
		return closeStore("resolve", db, 1, stderr)
	case err != nil:
		fmt.Fprintf(stderr, "idem resolve: %v\n", err)
		return closeStore("resolve", db, 1, stderr)
	}
	switch *as {
	case "released":
		err = lease.Release(ctx)
	case "unknown":
		err = lease.MarkUnknown(ctx)
	default:
		err = lease.Complete(ctx, resp)
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem resolve: %v\n", err)
		return closeStore("resolve", db, 1, stderr)
	}
	attrs := []any{"tenant", scope.Tenant, "endpoint", scope.Endpoint, "key_hash", idem.KeyHash(scope.Key),
		"from", prev.State.String(), "as", *as, "attempts", prev.Attempts, "reason", *reason}
	if completed {
		attrs = append(attrs, "status", *status, "body_bytes", len(resp.Body))
	}
	newLogger(stderr).Warn("idem resolve: record resolved by an operator", attrs...)
	fmt.Fprintf(stdout, "resolved key hash %s as %s\n", idem.KeyHash(scope.Key), *as)
	return closeStore("resolve", db, 0, stderr)
}
