package idem

import (
	"context"
	"encoding/hex"
	"log/slog"
	"time"
)

// The names of the events sent to Options.Events, one per state
// transition.
const (
	EventClaimed    = "claimed"    // a claim won the key; the operation may run
	EventReplayed   = "replayed"   // a claim got the stored response
	EventConflict   = "conflict"   // a claim found the key in progress (ErrInProgress)
	EventMismatch   = "mismatch"   // a claim carried another fingerprint (ErrFingerprintMismatch)
	EventPending    = "pending"    // a claim found an unresolved outcome (ErrOutcomePending)
	EventCompleted  = "completed"  // a lease stored its response
	EventReleased   = "released"   // a lease freed the key
	EventUnknown    = "unknown"    // a lease recorded an unknown outcome
	EventFailed     = "failed"     // a lease recorded a failure
	EventTakenOver  = "taken_over" // a stuck record got a new lease (TakeOver, Reconcile)
	EventReconciled = "reconciled" // Options.Reconcile resolved an overdue record
	EventSwept      = "swept"      // an expired record was deleted
)

// fingerprintPrefixBytes is how much of a fingerprint an event shows:
// enough to tell two requests apart in a log, too little to matter.
const fingerprintPrefixBytes = 6

// event sends one transition of rec, stored under s, to Options.Events;
// its latency is the time since start, left out for a zero start.
func (db *DB) event(name string, s Scope, rec *Record, start time.Time) {
	l := db.opts.Events
	if l == nil || !l.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs,
		slog.String("event", name),
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
	if !start.IsZero() {
		attrs = append(attrs, slog.Duration("latency", db.opts.Now().Sub(start)))
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "idem: "+name, attrs...)
}
