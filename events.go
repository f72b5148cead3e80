package idem

import (
	"context"
	"encoding/hex"
	"log/slog"
	"sync/atomic"
	"time"
)

// Event is one thing that happens to a key: a transition of its record, or
// the answer a claim got. Every backend counts each event (Metrics.Events)
// and may log it (LogEvent); idemprom exports the counts. The table below
// is the one list of them.
type Event uint8

// The events, in the order of Metrics.Events.
const (
	EventClaimed     Event = iota // a claim won the key; the operation may run
	EventReplayed                 // a claim got the stored response
	EventConflict                 // a claim found the key in progress (ErrInProgress)
	EventMismatch                 // a claim carried another fingerprint (ErrFingerprintMismatch)
	EventPending                  // a claim found an unresolved outcome (ErrOutcomePending)
	EventCompleted                // a lease stored its response
	EventReleased                 // a lease freed the key
	EventUnknown                  // a lease recorded an unknown outcome
	EventFailed                   // a lease recorded a failure
	EventTakenOver                // a stuck record got a new lease (take-over, reconciliation)
	EventReconciled               // the reconciler resolved an overdue record
	EventSwept                    // an expired record was deleted
	EventClockBehind              // a claim or take-over was refused because the clock is behind (ErrClockBehind)

	NumEvents = iota // the number of events
)

var events = [NumEvents]struct{ name, series, help string }{
	EventClaimed:    {"claimed", "idem_claims_total", "Claims that won their key, so the operation ran."},
	EventReplayed:   {"replayed", "idem_replays_total", "Claims answered with the response stored by an earlier attempt."},
	EventConflict:   {"conflict", "idem_conflicts_total", "Claims refused because the key was in progress (HTTP 409 request_in_progress)."},
	EventMismatch:   {"mismatch", "idem_mismatches_total", "Claims refused because the key was used for a different request (HTTP 422)."},
	EventPending:    {"pending", "idem_outcome_pending_total", "Claims refused because an earlier attempt's outcome is unknown or failed (HTTP 409 outcome_pending)."},
	EventCompleted:  {"completed", "idem_completions_total", "Leases that stored their response."},
	EventReleased:   {"released", "idem_releases_total", "Leases that freed their key because nothing was committed."},
	EventUnknown:    {"unknown", "idem_unknowns_total", "Leases that ended with an unknown outcome."},
	EventFailed:     {"failed", "idem_failures_total", "Leases that ended marked failed."},
	EventTakenOver:  {"taken_over", "idem_takeovers_total", "Stuck records given a new lease by an operator or the reconciler."},
	EventReconciled: {"reconciled", "idem_reconciled_total", "Overdue records the reconciler resolved."},
	EventSwept:      {"swept", "idem_swept_records_total", "Expired records the sweeper deleted."},
	EventClockBehind: {"clock_behind", "idem_clock_behind_total",
		"Claims and take-overs refused because the clock was behind the newest time the store had written under (HTTP 503 clock_behind)."},
}

// String returns the event's name as log lines carry it ("claimed").
func (e Event) String() string {
	if e < NumEvents {
		return events[e].name
	}
	return "event(?)"
}

// Series returns the name of the Prometheus counter of e.
func (e Event) Series() string { return events[e].series }

// Help returns what the counter of e counts.
func (e Event) Help() string { return events[e].help }

// Tally counts events. The zero value is ready; it is safe for concurrent
// use.
type Tally struct{ n [NumEvents]atomic.Int64 }

// Add counts one e.
func (t *Tally) Add(e Event) { t.n[e].Add(1) }

// Counts returns the counts so far, indexed by Event.
func (t *Tally) Counts() [NumEvents]int64 {
	var c [NumEvents]int64
	for i := range c {
		c[i] = t.n[i].Load()
	}
	return c
}

// fingerprintPrefixBytes is how much of a fingerprint a log line shows:
// enough to tell two requests apart, too little to matter.
const fingerprintPrefixBytes = 6

// LogEvent writes e, which happened to rec stored under s, to l as one
// Info line: the tenant, the endpoint, a hash of the key (never the key
// itself), a fingerprint prefix, the state after the event, the response
// status when there is one, the attempts past the first, and latency
// unless it is negative. Every backend logs events this way. A nil l logs
// nothing.
func LogEvent(l *slog.Logger, e Event, s Scope, rec *Record, latency time.Duration) {
	if l == nil || !l.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs,
		slog.String("event", e.String()),
		slog.String("tenant", s.Tenant),
		slog.String("endpoint", s.Endpoint),
		slog.String("key_hash", KeyHash(s.Key)),
		slog.String("fingerprint", hex.EncodeToString(rec.Fingerprint[:fingerprintPrefixBytes])),
		slog.String("state", rec.State.String()),
	)
	if rec.Response.Status != 0 {
		attrs = append(attrs, slog.Int("status", rec.Response.Status))
	}
	if rec.Attempts > 1 {
		attrs = append(attrs, slog.Int("attempts", int(rec.Attempts)))
	}
	if latency >= 0 {
		attrs = append(attrs, slog.Duration("latency", latency))
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "idem: "+e.String(), attrs...)
}
