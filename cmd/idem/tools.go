package main

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// The operator tools (inspect, get, stats, check, compact, resolve) share
// what is in this file: how they open an embedded store, the flags that
// name a record, and how a record is shown. store.go opens either store.

// openExisting opens the embedded store in dir for the tool called name. Unlike
// the proxy, a tool never creates a store, and it needs the
// directory to itself: Pebble keeps one process per store, and reading
// files that a running process compacts away is not safe. It returns the
// exit status on failure: 1 for a missing or busy store, 2 for bad usage.
func openExisting(name, dir string, events bool, stderr io.Writer) (idem.Operator, int) {
	if dir == "" {
		fmt.Fprintf(stderr, "idem %s: --data is required\n", name)
		return nil, 2
	}
	log := newLogger(stderr)
	opts := &pebblestore.Options{MustExist: true, SweepInterval: -1, Logger: log}
	if events {
		opts.Events = log
	}
	db, err := pebblestore.Open(dir, opts)
	switch {
	case err == nil:
		return db, 0
	case errors.Is(err, pebblestore.ErrNoStore):
		fmt.Fprintf(stderr, "idem %s: %s holds no idem store; check --data (idem proxy creates one at its first start)\n", name, dir)
	case errors.Is(err, pebblestore.ErrLocked):
		fmt.Fprintf(stderr, "idem %s: data directory %s is in use by another process, most likely a running idem proxy.\n"+
			"The tools need the store to themselves. While it runs, inspect, get, stats, resolve, check and compact work through\n"+
			"its admin listener with --admin URL, if it was started with an admin token (--admin-token-file or "+adminTokenEnv+");\n"+
			"otherwise stop it (SIGTERM lets requests in flight finish), run this again, then start it.\n"+
			"(Records kept in PostgreSQL, with --store, can be inspected and changed while it runs.)\n", name, dir)
	default:
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
	}
	return nil, 1
}

// closeStore closes db and turns a failure into exit status 1, keeping
// code otherwise.
func closeStore(name string, db io.Closer, code int, stderr io.Writer) int {
	if err := db.Close(); err != nil {
		fmt.Fprintf(stderr, "idem %s: closing the store: %v\n", name, err)
		return 1
	}
	return code
}

// scopeFlags adds the flags that name one record.
func scopeFlags(fs *flag.FlagSet) *idem.Scope {
	s := new(idem.Scope)
	fs.StringVar(&s.Tenant, "tenant", "", "tenant the key belongs to (empty for a single-tenant service)")
	fs.StringVar(&s.Endpoint, "endpoint", "", `endpoint, as the store names it, e.g. "POST /v1/payments" (required)`)
	fs.StringVar(&s.Key, "key", "", "the idempotency key (required)")
	return s
}

// checkScope reports what is missing from a scope named on the command
// line.
func checkScope(s *idem.Scope) error {
	if s.Endpoint == "" || s.Key == "" {
		return errors.New("--endpoint and --key are required")
	}
	return s.Validate()
}

// usageError prints a usage mistake and the flags, and returns status 2.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "idem %s: "+format+"\n", append([]any{fs.Name()}, a...)...)
	fs.Usage()
	return 2
}

// parseTool parses a tool's flags; no tool takes positional arguments.
// done reports whether the tool must return code at once: after --help,
// or a usage mistake.
func parseTool(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		return parseStatus(err), true
	}
	if fs.NArg() > 0 {
		return usageError(fs, stderr, "unexpected argument %q", fs.Arg(0)), true
	}
	return 0, false
}

// parseTool is parseTool for a tool that opens a store: a mistake in
// --data or --store is a usage mistake too.
func (s *storeFlags) parseTool(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, done bool) {
	if code, done := parseTool(fs, args, stderr); done {
		return code, true
	}
	if err := s.validate(); err != nil {
		return usageError(fs, stderr, "%v", err), true
	}
	return 0, false
}

// recordView is a record as the tools print it in JSON. The key itself is
// there only when the operator asked for it: listings end up in tickets
// and chat, and a key is half of what replays someone's response.
type recordView struct {
	Tenant      string    `json:"tenant"`
	Endpoint    string    `json:"endpoint"`
	Key         string    `json:"key,omitempty"`
	KeyHash     string    `json:"key_hash"`
	State       string    `json:"state"`
	Status      int       `json:"status,omitempty"`
	Fingerprint string    `json:"fingerprint"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	LeaseUntil  time.Time `json:"lease_until"`
	Attempts    uint32    `json:"attempts"`
	BodyBytes   int64     `json:"body_bytes"`
	BodySHA256  string    `json:"body_sha256"`
	BodyOmitted bool      `json:"body_omitted,omitempty"`
	Expired     bool      `json:"expired,omitempty"`
	// Header and Body are filled in by get only.
	Header map[string][]string `json:"header,omitempty"`
	Body   *string             `json:"body,omitempty"`
}

func viewOf(rec *idem.Record, showKey bool, now time.Time) recordView {
	v := recordView{
		Tenant: rec.Scope.Tenant, Endpoint: rec.Scope.Endpoint, KeyHash: idem.KeyHash(rec.Scope.Key),
		State: rec.State.String(), Status: rec.Response.Status, Fingerprint: rec.Fingerprint.String(),
		CreatedAt: rec.CreatedAt.UTC(), UpdatedAt: rec.UpdatedAt.UTC(), ExpiresAt: rec.ExpiresAt.UTC(),
		LeaseUntil: rec.LeaseUntil.UTC(), Attempts: rec.Attempts, BodyBytes: rec.BodyLen,
		BodySHA256: hex.EncodeToString(rec.BodyDigest[:]), BodyOmitted: rec.BodyOmitted,
		Expired: !now.Before(rec.ExpiresAt),
	}
	if showKey {
		v.Key = rec.Scope.Key
	}
	return v
}

// age prints a duration the way a person reads a listing: whole seconds,
// minutes, hours or days, never more than two units.
func age(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		s = fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
	if neg {
		return "-" + s
	}
	return s
}

// parseStateFlag reads --state; empty means any.
func parseStateFlag(s string) (idem.State, error) {
	if s == "" {
		return 0, nil
	}
	st, err := idem.ParseState(strings.ToLower(s))
	if err != nil {
		return 0, fmt.Errorf("--state %q: want in_progress, completed, failed or unknown", s)
	}
	return st, nil
}
