package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// storeStats is what idem stats reports, in the JSON it prints with
// --json.
type storeStats struct {
	Records          int64            `json:"records"`
	ByState          map[string]int64 `json:"by_state"`
	Overdue          int64            `json:"overdue"`
	OldestInProgress float64          `json:"oldest_in_progress_seconds"`
	Expired          int64            `json:"expired_awaiting_sweep"`
	// The embedded store's figures: its directory's size and Pebble's
	// read amplification.
	DiskBytes *uint64 `json:"disk_bytes,omitempty"`
	ReadAmp   *int    `json:"read_amplification,omitempty"`
	// PostgreSQL's: the table's size with its indexes and TOAST.
	TableBytes *uint64 `json:"table_bytes,omitempty"`
}

// pgTableBytes is the engine figure in which pgstore reports its table's
// size.
const pgTableBytes = "idem_pg_table_bytes"

func runStats(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := addStoreFlags(fs, "directory of the idempotency store")
	store.addAdmin()
	asJSON := fs.Bool("json", false, "print one JSON object, for scripts")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: idem stats [--data DIR | --store DSN | --admin URL] [--json]

Summarizes the store: live records by state, in-progress records past
their lease (overdue) and the age of the oldest, expired records that the
sweeper has not deleted yet, and the space the records take: for the
embedded store the space on disk and Pebble's health (read amplification:
how many tables a read may visit), for PostgreSQL the size of the table
with its indexes. It reads every record once. While a proxy runs,
its /metrics endpoint reports the same figures.

Reference: `+docsURL("docs/operating.md")+`

`+toolStoreRule+"\n"+adminToolRule+"\n")
		fs.PrintDefaults()
	}
	if code, done := store.parseTool(fs, args, stderr); done {
		return code
	}
	db, code := store.openTools("stats", false, stderr)
	if db == nil {
		return code
	}
	st := storeStats{ByState: map[string]int64{}}
	for _, s := range []idem.State{idem.StateInProgress, idem.StateCompleted, idem.StateFailed, idem.StateUnknown} {
		st.ByState[s.String()] = 0
	}
	// The pending index counts only unfinished records, so completed ones
	// are counted here, by reading them.
	for rec, err := range db.Records(context.Background(), idem.Filter{}) {
		if err != nil {
			fmt.Fprintf(stderr, "idem stats: %v\n", err)
			return closeStore("stats", db, 1, stderr)
		}
		st.Records++
		st.ByState[rec.State.String()]++
	}
	m, err := db.Metrics(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "idem stats: %v\n", err)
		return closeStore("stats", db, 1, stderr)
	}
	st.Overdue, st.OldestInProgress, st.Expired = m.Overdue, m.OldestInProgress.Seconds(), m.Expired
	if v, ok := m.Figure(pebblestore.FigureDiskBytes); ok {
		st.DiskBytes = ptr(uint64(v))
	}
	if v, ok := m.Figure(pebblestore.FigureReadAmp); ok {
		st.ReadAmp = ptr(int(v))
	}
	if v, ok := m.Figure(pgTableBytes); ok {
		st.TableBytes = ptr(uint64(v))
	}
	if *asJSON {
		json.NewEncoder(stdout).Encode(st)
		return closeStore("stats", db, 0, stderr)
	}
	fmt.Fprintf(stdout, "records          %d live\n", st.Records)
	for _, s := range []idem.State{idem.StateCompleted, idem.StateInProgress, idem.StateUnknown, idem.StateFailed} {
		fmt.Fprintf(stdout, "  %-14s %d\n", s, st.ByState[s.String()])
	}
	oldest := "-"
	if m.OldestInProgress > 0 {
		oldest = age(m.OldestInProgress)
	}
	fmt.Fprintf(stdout, "overdue          %d in progress past their lease\n", st.Overdue)
	fmt.Fprintf(stdout, "oldest claim     %s in progress\n", oldest)
	fmt.Fprintf(stdout, "expired          %d awaiting sweep (idem compact removes them now)\n", st.Expired)
	if st.DiskBytes != nil {
		fmt.Fprintf(stdout, "disk             %s\n", bytesIEC(*st.DiskBytes))
	}
	if st.ReadAmp != nil {
		health := "healthy"
		if *st.ReadAmp > healthyReadAmp {
			health = "reads slowed by too many tables; idem compact merges them"
		}
		fmt.Fprintf(stdout, "read amp         %d (%s)\n", *st.ReadAmp, health)
	}
	if st.TableBytes != nil {
		fmt.Fprintf(stdout, "table            %s with its indexes\n", bytesIEC(*st.TableBytes))
	}
	if st.Overdue > 0 || st.ByState["unknown"] > 0 || st.ByState["failed"] > 0 {
		fmt.Fprintln(stdout, "\nNeeds attention: list with idem inspect --state in_progress --older-than 1m (or --state unknown,")
		fmt.Fprintln(stdout, "--state failed) and settle each with idem resolve.")
	}
	return closeStore("stats", db, 0, stderr)
}

// healthyReadAmp is the read amplification past which stats calls the
// store unhealthy: one whose compactions keep up stays well below it.
const healthyReadAmp = 20

func ptr[T any](v T) *T { return &v }

// bytesIEC prints a byte count with a binary unit.
func bytesIEC(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
