package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkv/idem"
)

func runInspect(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store")
	store.addAdmin()
	tenant := fs.String("tenant", "", "list only this tenant's records")
	endpoint := fs.String("endpoint", "", `list only this endpoint's records, e.g. "POST /v1/payments"`)
	state := fs.String("state", "", "list only records in this state: in_progress, completed, failed or unknown")
	olderThan := fs.Duration("older-than", 0, "list only records claimed at least this long ago, e.g. 10m")
	asJSON := fs.Bool("json", false, "print one JSON object a line, for scripts")
	showKeys := fs.Bool("show-keys", false, "show idempotency keys in full (by default only a hash of each)")
	expired := fs.Bool("expired", false, "also list records past their TTL that are not swept yet")
	limit := fs.Int("limit", 0, "stop after this many records (0: all)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem inspect [--data DIR | --store DSN | --admin URL] [--tenant T] [--endpoint E]
                    [--state S] [--older-than D] [--json] [--show-keys]
                    [--expired] [--limit N]

Lists the records in the store, in key order: a table for people, or JSON
lines with --json. Keys are shown as a hash unless --show-keys is given;
the hash is the key_hash of idem's log events, so a listing and a log line
can be matched without either holding the key.

Find stuck work with --state in_progress --older-than 1m, or --state
unknown; resolve it with idem resolve.

Reference: `+docsURL("docs/operating.md")+`

`+toolStoreRule+"\n"+adminToolRule+"\n")
		fs.PrintDefaults()
	}
	if code, done := store.parseTool(fs, args, stderr); done {
		return code
	}
	want, err := parseStateFlag(*state)
	if err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if *olderThan < 0 || *limit < 0 {
		return usageError(fs, stderr, "--older-than and --limit must not be negative")
	}
	db, code := store.openTools("inspect", false, stderr)
	if db == nil {
		return code
	}
	now := time.Now()
	f := idem.Filter{Tenant: *tenant, Endpoint: *endpoint, State: want, Expired: *expired}
	if *olderThan > 0 {
		f.CreatedBefore = now.Add(-*olderThan)
	}

	var tw *tabwriter.Writer
	enc := json.NewEncoder(stdout)
	if !*asJSON {
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		keyCol := "KEY HASH"
		if *showKeys {
			keyCol = "KEY"
		}
		fmt.Fprintf(tw, "TENANT\tENDPOINT\t%s\tSTATE\tSTATUS\tAGE\tEXPIRES IN\tATTEMPTS\n", keyCol)
	}
	n := 0
	for rec, err := range db.Records(context.Background(), f) {
		if err != nil {
			fmt.Fprintf(stderr, "idem inspect: %v\n", err)
			return closeStore("inspect", db, 1, stderr)
		}
		v := viewOf(rec, *showKeys, now)
		if *asJSON {
			enc.Encode(v)
		} else {
			key := v.KeyHash
			if *showKeys {
				key = v.Key
			}
			status := "-"
			if v.Status != 0 {
				status = fmt.Sprint(v.Status)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", cell(v.Tenant), cell(v.Endpoint), cell(key), v.State, status,
				age(now.Sub(rec.CreatedAt)), age(rec.ExpiresAt.Sub(now)), v.Attempts)
		}
		if n++; *limit > 0 && n == *limit {
			break
		}
	}
	if tw != nil {
		tw.Flush()
		fmt.Fprintf(stderr, "%d records\n", n)
	}
	return closeStore("inspect", db, 0, stderr)
}

// cell makes s safe for one table cell: an empty one would vanish, and
// control characters or broken UTF-8 (tenants and keys are whatever the
// clients sent) would break the columns or the terminal, so those are
// quoted.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}
