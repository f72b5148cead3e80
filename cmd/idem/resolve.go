package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	store.addAdmin()
	scope := scopeFlags(fs)
	as := fs.String("as", "", "the real outcome: released, unknown or completed (required)")
	status := fs.Int("status", 0, "with --as completed: the HTTP status the operation really answered (required)")
	bodyFile := fs.String("body-file", "", "with --as completed: file holding the response body to replay (- for standard input)")
	header := headerFlags{}
	fs.Var(header, "header", `with --as completed: a response header to replay, "Name: value" (repeatable)`)
	reason := fs.String("reason", "", "why, for the log: a ticket number, the provider's answer")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem resolve [--data DIR | --store DSN | --admin URL] [--tenant T] --endpoint E --key K
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

Reference: `+docsURL("docs/operating.md#stuck-keys-while-the-service-runs")+`

`+toolStoreRule+"\n"+adminToolRule+"\n")
		fs.PrintDefaults()
	}
	if code, done := store.parseTool(fs, args, stderr); done {
		return code
	}
	if err := checkScope(scope); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	res := resolution{As: *as, Response: idem.Response{Status: *status, Header: http.Header(header)}, Reason: *reason}
	err := res.check(true)
	if err == nil && *bodyFile != "" && res.As != "completed" {
		err = errors.New("--status, --body-file and --header go with --as completed only")
	}
	if err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if *bodyFile != "" {
		_, b, err := readInput(*bodyFile, stdin)
		if err != nil {
			fmt.Fprintf(stderr, "idem resolve: %v\n", err)
			return 1
		}
		res.Response.Body = b
	}

	db, code := store.openTools("resolve", true, stderr)
	if db == nil {
		return code
	}
	prev, err := db.Resolve(context.Background(), *scope, res)
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
	via := "store"
	if store.admin != "" {
		via = "admin"
	}
	logResolution(newLogger(stderr), *scope, prev, res, via)
	fmt.Fprintf(stdout, "resolved key hash %s as %s\n", idem.KeyHash(scope.Key), *as)
	return closeStore("resolve", db, 0, stderr)
}

// resolution is what an operator says about a stuck record: As is
// released, unknown or completed, and Response the answer to replay
// when completed. Reason goes to the log.
type resolution struct {
	As       string
	Response idem.Response
	Reason   string
}

// check reports a resolution that makes no sense. cli says whether to
// name resolve's flags or the members of the admin route's request.
func (r resolution) check(cli bool) error {
	dash, body := "", "body_base64"
	if cli {
		dash, body = "--", "--body-file"
	}
	completed := r.As == "completed"
	switch {
	case r.As != "released" && r.As != "unknown" && !completed:
		return fmt.Errorf("%sas %q: want released, unknown or completed", dash, r.As)
	case completed && (r.Response.Status < 100 || r.Response.Status > 999):
		return fmt.Errorf("%sas completed needs %sstatus between 100 and 999", dash, dash)
	case !completed && (r.Response.Status != 0 || len(r.Response.Body) > 0 || len(r.Response.Header) > 0):
		return fmt.Errorf("%sstatus, %s and %sheader go with %sas completed only", dash, body, dash, dash)
	}
	return nil
}

// settle takes the stuck record at s over and ends the new lease as res
// says. It returns the record as it was before, which the takeover turns
// into in progress under a new lease.
func settle(ctx context.Context, db idem.Operator, s idem.Scope, res resolution) (*idem.Record, error) {
	prev, err := db.Get(ctx, s)
	if err != nil {
		return nil, err
	}
	lease, err := db.TakeOver(ctx, s)
	if err != nil {
		return nil, err
	}
	switch res.As {
	case "released":
		err = lease.Release(ctx)
	case "unknown":
		err = lease.MarkUnknown(ctx)
	default:
		err = lease.Complete(ctx, res.Response)
	}
	return prev, err
}

// logResolution logs a settled record as one structured line, with the
// key's hash and never the key; via says whether the tool changed the
// store itself or a running server did it on the admin listener.
func logResolution(log *slog.Logger, s idem.Scope, prev *idem.Record, res resolution, via string) {
	attrs := []any{"tenant", s.Tenant, "endpoint", s.Endpoint, "key_hash", idem.KeyHash(s.Key),
		"from", prev.State.String(), "as", res.As, "attempts", prev.Attempts, "reason", res.Reason}
	if res.As == "completed" {
		attrs = append(attrs, "status", res.Response.Status, "body_bytes", len(res.Response.Body))
	}
	log.Warn("idem resolve: record resolved by an operator", append(attrs, "via", via)...)
}
