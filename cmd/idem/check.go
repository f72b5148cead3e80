package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkv/idem/pebblestore"
)

func runCheck(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store")
	store.addAdmin()
	asJSON := fs.Bool("json", false, "print one JSON object a problem, for scripts")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem check [--data DIR | --store DSN | --admin URL] [--json]

Reads the whole store and reports every record, expiry or pending index
entry and body chunk that breaks the invariants between them: what a
crash, a bug or a damaged disk may leave behind. Each problem is one line:
its kind (record_undecodable, expiry_missing, pending_stale,
chunks_orphaned, ...), the record's tenant, endpoint and key hash, never
the key, and what is wrong. A summary line follows. With --json each
problem is a JSON object on a line of its own, with the fields kind,
tenant, endpoint, key_hash and detail, and the summary goes to standard
error.

Exit status 0 means the store is sound; 1 that a problem was found or the
store could not be read. The check is the embedded store's: there is no
consistency check for a PostgreSQL store, whose table, primary key and
column constraints keep its records in shape, so with --store it says so
and exits 1, and so does --admin on a server that keeps its records there.

With --admin the running server checks its own store, from a snapshot,
while it serves: the check reads every key, which its requests feel as
latency, so a quiet hour suits it best.

Reference: `+docsURL("docs/operating.md")+`

`+toolStoreRule+"\n"+adminToolRule+"\n")
		fs.PrintDefaults()
	}
	if code, done := store.parseTool(fs, args, stderr); done {
		return code
	}
	if store.postgres() {
		fmt.Fprintf(stderr, "idem check: no consistency check for this store: %s keeps its records in one table,\n"+
			"whose primary key and constraints PostgreSQL enforces itself; idem check reads embedded stores (--data)\n", store.where())
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if store.admin != "" {
		c, code := store.openAdmin("check", stderr)
		if c == nil {
			return code
		}
		defer c.Close()
		res, err := c.Check(ctx)
		if err != nil && !errors.As(err, new(*checkStopped)) {
			fmt.Fprintf(stderr, "idem check: %v\n", err)
			return 1
		}
		return reportCheck(res, err, *asJSON, stdout, stderr)
	}
	db, code := store.openTool("check", false, stderr)
	if db == nil {
		return code
	}
	c, ok := db.(checker)
	if !ok {
		fmt.Fprintln(stderr, "idem check: this store has no consistency check")
		return closeStore("check", db, 1, stderr)
	}
	res, err := c.Check(ctx)
	return closeStore("check", db, reportCheck(res, err, *asJSON, stdout, stderr), stderr)
}

// reportCheck prints what Check found and returns the exit status: 1 when
// it found a problem or could not finish.
func reportCheck(res pebblestore.CheckResult, err error, asJSON bool, stdout, stderr io.Writer) (code int) {
	enc := json.NewEncoder(stdout)
	for _, p := range res.Problems {
		if asJSON {
			enc.Encode(p)
		} else {
			fmt.Fprintln(stdout, p)
		}
	}
	summary := stdout
	if asJSON {
		summary = stderr
	}
	read := fmt.Sprintf("%d records, %d expiry entries, %d pending entries, %d body chunks",
		res.Records, res.ExpiryEntries, res.PendingEntries, res.Chunks)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "idem check: %v\n", err)
		fmt.Fprintf(summary, "stopped after %s: %d problems so far\n", read, len(res.Problems))
		code = 1
	case !res.OK():
		fmt.Fprintf(summary, "checked %s: %d problems\n", read, len(res.Problems))
		code = 1
	default:
		fmt.Fprintf(summary, "checked %s: no problems\n", read)
	}
	return code
}

// checker is a store that can walk its own invariants: the embedded one
// (pebblestore.Store.Check).
type checker interface {
	Check(ctx context.Context) (pebblestore.CheckResult, error)
}
