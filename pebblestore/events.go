package pebblestore

import (
	"time"

	"github.com/idemkv/idem"
)

// note counts e and sends it, as it happened to rec stored under s, to
// Options.Events; its latency is the time since start, left out for a
// zero start.
func (db *Store) note(e idem.Event, s idem.Scope, rec *idem.Record, start time.Time) {
	db.tally.Add(e)
	if db.opts.Events == nil {
		return
	}
	latency := time.Duration(-1)
	if !start.IsZero() {
		latency = db.opts.Now().Sub(start)
	}
	idem.LogEvent(db.opts.Events, e, s, rec, latency)
}
