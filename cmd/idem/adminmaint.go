package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pebblestore"
)

// The maintenance routes: what compact and check do, on the admin listener
// beside the operator routes and behind the same token.
//
//	POST /v1/admin/compact  sweep the expired records and compact the store;
//	                        JSON lines: progress, then the result or an error
//	GET  /v1/admin/check    check the store's invariants (embedded store only)

// codeCheckUnsupported is the problem code of a check on a store that has
// no consistency check: 501.
const codeCheckUnsupported = "check_unsupported"

// compactLine is one line of POST /v1/admin/compact's answer: progress
// (Phase, Done, Total), then a last line with Result or Error.
type compactLine struct {
	Phase  string     `json:"phase,omitempty"`
	Done   int64      `json:"done,omitempty"`
	Total  int64      `json:"total,omitempty"`
	Result *sweepView `json:"result,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// sweepView is an idem.SweepResult on the wire.
type sweepView struct {
	Records     int   `json:"records"`
	Bytes       int64 `json:"bytes"`
	Compactions int   `json:"compactions"`
}

// checkAnswer is GET /v1/admin/check's answer: what idem check prints.
// Error says that the check stopped early; the counts and problems are
// then those found before.
type checkAnswer struct {
	Records        int                   `json:"records"`
	ExpiryEntries  int                   `json:"expiry_entries"`
	PendingEntries int                   `json:"pending_entries"`
	Chunks         int                   `json:"chunks"`
	Problems       []pebblestore.Problem `json:"problems"`
	Error          string                `json:"error,omitempty"`
}

// compact streams its progress, a line at each phase and at each
// hundredth of a phase's work, so that the tool can draw its bar. The
// operator's tool going away stops the compaction; what was swept stays
// swept.
func (a *admin) compact(w http.ResponseWriter, r *http.Request) {
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	started := false
	send := func(l compactLine) {
		if !started {
			w.Header().Set("Content-Type", "application/jsonl")
			w.Header().Set("Cache-Control", "no-store")
			started = true
		}
		if enc.Encode(l) == nil {
			rc.Flush()
		}
	}
	var last idem.CompactProgress
	res, err := a.db.Compact(r.Context(), func(p idem.CompactProgress) {
		step := max(p.Total/100, 1)
		if started && p.Phase == last.Phase && p.Done != p.Total && p.Done-last.Done < step {
			return
		}
		last = p
		send(compactLine{Phase: p.Phase, Done: p.Done, Total: p.Total})
	})
	switch {
	case err != nil && r.Context().Err() != nil:
		a.log.Info("idem: compaction through the admin listener stopped: the operator went away", "records", res.Records)
	case err != nil && !started:
		a.storeFailed(w, "compact", err)
	case err != nil:
		a.log.Error("idem: operator route failed", "route", "compact", "err", err)
		send(compactLine{Error: "the compaction stopped: the store could not be read or written; see the server's log"})
	default:
		a.log.Info("idem: compacted through the admin listener", "records", res.Records, "bytes", res.Bytes, "compactions", res.Compactions)
		send(compactLine{Result: &sweepView{Records: res.Records, Bytes: res.Bytes, Compactions: res.Compactions}})
	}
}

func (a *admin) check(w http.ResponseWriter, r *http.Request) {
	c, ok := a.db.(checker)
	if !ok {
		adminProblem(w, http.StatusNotImplemented, codeCheckUnsupported,
			"this server's store has no consistency check: PostgreSQL enforces its table's primary key and constraints itself; idem check reads embedded stores", 0)
		return
	}
	res, err := c.Check(r.Context())
	if err != nil && r.Context().Err() != nil {
		return // the operator went away
	}
	out := checkAnswer{Records: res.Records, ExpiryEntries: res.ExpiryEntries, PendingEntries: res.PendingEntries, Chunks: res.Chunks,
		Problems: res.Problems}
	if out.Problems == nil {
		out.Problems = []pebblestore.Problem{}
	}
	if err != nil {
		a.log.Error("idem: operator route failed", "route", "check", "err", err)
		out.Error = "the check stopped: the store could not be read; see the server's log"
	}
	writeAdminJSON(w, out)
}

// Compact has the server compact its store, calling progress as the
// server reports it. It has no time bound beyond ctx: a compaction of a
// large store takes minutes.
func (c *adminClient) Compact(ctx context.Context, progress func(idem.CompactProgress)) (idem.SweepResult, error) {
	resp, err := c.do(ctx, "POST", "/v1/admin/compact", nil)
	if err != nil {
		return idem.SweepResult{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l compactLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return idem.SweepResult{}, fmt.Errorf("the admin listener at %s: reading its answer: %w", c.base, err)
		}
		switch {
		case l.Error != "":
			return idem.SweepResult{}, fmt.Errorf("the admin listener at %s: %s", c.base, l.Error)
		case l.Result != nil:
			return idem.SweepResult{Records: l.Result.Records, Bytes: l.Result.Bytes, Compactions: l.Result.Compactions}, nil
		case progress != nil:
			progress(idem.CompactProgress{Phase: l.Phase, Done: l.Done, Total: l.Total})
		}
	}
	if err := sc.Err(); err != nil {
		return idem.SweepResult{}, fmt.Errorf("the admin listener at %s: reading its answer: %w", c.base, err)
	}
	return idem.SweepResult{}, fmt.Errorf("the admin listener at %s: the answer ended before the compaction did", c.base)
}

// Check has the server check its store. Like Compact, it is bounded by
// ctx alone. A check the server could not finish returns what it found
// and a *checkStopped; any other error means there is no result.
func (c *adminClient) Check(ctx context.Context) (pebblestore.CheckResult, error) {
	resp, err := c.do(ctx, "GET", "/v1/admin/check", nil)
	if err != nil {
		return pebblestore.CheckResult{}, err
	}
	defer discard(resp.Body)
	var a checkAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return pebblestore.CheckResult{}, fmt.Errorf("the admin listener at %s: reading its answer: %w", c.base, err)
	}
	res := pebblestore.CheckResult{Records: a.Records, ExpiryEntries: a.ExpiryEntries, PendingEntries: a.PendingEntries, Chunks: a.Chunks, Problems: a.Problems}
	if a.Error != "" {
		return res, &checkStopped{fmt.Sprintf("the admin listener at %s: %s", c.base, a.Error)}
	}
	return res, nil
}

// checkStopped is the error of a check that the server began but could
// not finish: unlike a refusal, it comes with what was found before.
type checkStopped struct{ msg string }

func (e *checkStopped) Error() string { return e.msg }
