package fuzz

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// FuzzOps runs a program of store operations, each chosen by the fuzzer's
// bytes, and checks every answer against a model of the contract: claims,
// replays, conflicts, mismatches and pending outcomes, every way a lease
// ends, operators' takeovers, reconciliation passes whose reconciler
// resolves, leaves or fails each overdue record, a clock that moves across
// lease ends and expiries, sweeps, the metrics, and crashes of the
// filesystem (Pebble's crashable in-memory one) followed by a reopen.
// Whatever was acknowledged before a crash must answer the same after it,
// and a lease from before it must be refused.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 0, 3, 24, 0, 0, 0, 3, 9, 0})               // claim, complete, replay, mismatch, get
	f.Add([]byte{0, 5, 0, 5, 7, 3, 0, 5, 8, 1, 0, 5, 3, 5})    // claim, conflict, lease runs out, pending, crash, pending, stale lease
	f.Add([]byte{0, 0, 10, 0, 5, 0, 10, 0, 3, 60, 3, 0, 0, 0}) // claim, takeover refused, unknown, takeover, old lease lost, complete, replay
	f.Add([]byte{1, 9, 3, 4, 8, 1, 7, 4, 0, 9, 5, 5, 6, 9, 8, 3})
	f.Add([]byte{2, 0, 3, 6, 7, 2, 6, 0, 4, 4, 5, 7, 4, 8, 2, 1, 2})
	f.Add([]byte{0, 0, 0, 1, 0, 2, 7, 3, 11, 58, 12, 0, 3, 0, 12, 0, 9, 0})             // three overdue claims: the reconciler leaves one, releases one, marks one unknown; metrics, complete with its lease, metrics, get
	f.Add([]byte{0, 0, 1, 0, 7, 3, 11, 4, 9, 0, 7, 3, 11, 0, 12, 0, 7, 4, 8, 0, 12, 0}) // claim, conflict, the reconciler fails, get, it completes, metrics, expiry, sweep, metrics
	f.Fuzz(func(t *testing.T, prog []byte) {
		h := newOpsHarness(t)
		defer h.close()
		in := bytes.NewReader(prog)
		next := func() int { b, _ := in.ReadByte(); return int(b) }
		for step := 0; in.Len() > 0 && step < 200; step++ {
			op, arg := next(), next()
			h.step(op%13, arg)
		}
	})
}

// The model's parameters: three keys, two request fingerprints, a lease of
// a second and the shortest TTL allowed for it.
const (
	opsKeys  = 3
	opsLease = time.Second
	opsTTL   = 10 * opsLease

	opsInlineBody = 512
	opsMaxBody    = 4096
)

// opsBodies are the responses an operation may complete with: none, one
// too short to compress, one that compresses and stays inline, one stored
// in chunks and one too large to keep at all.
var opsBodies = func() [][]byte {
	rng := rand.New(rand.NewPCG(3, 4))
	random := make([]byte, 100)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	jsonBody := func(n int) []byte {
		return []byte(strings.Repeat(`{"id":"li_1","amount":4200},`, n/28+1)[:n])
	}
	return [][]byte{nil, random, jsonBody(400), jsonBody(3000), jsonBody(5000)}
}()

// modelRecord is what the store should hold for a key.
type modelRecord struct {
	fp         int
	state      idem.State
	leaseUntil time.Time
	expiresAt  time.Time
	status     int
	body       []byte
	omitted    bool
	owner      int // the lease that may still change it
	createdAt  time.Time
}

// opsLeaseEntry is a lease the harness was granted, kept so that it can be
// tried again after others replaced it.
type opsLeaseEntry struct {
	lease idem.Lease
	id    int
	epoch int // the store incarnation that granted it
}

type opsHarness struct {
	t       *testing.T
	ctx     context.Context
	fs      *vfs.MemFS
	db      *pebblestore.Store
	clock   *idemtest.Clock
	epoch   int
	leases  [opsKeys][]opsLeaseEntry // every lease granted per key, newest last
	model   [opsKeys]*modelRecord
	nextID  int
	crashes uint64
	counts  idem.Metrics // the event counts the store should report since it opened
	// decide is the reconciler's choice for each key during a pass.
	decide func(k int) int
}

func newOpsHarness(t *testing.T) *opsHarness {
	h := &opsHarness{t: t, ctx: context.Background(), fs: vfs.NewCrashableMem(), clock: idemtest.NewClock()}
	h.open()
	return h
}

func (h *opsHarness) open() {
	// No background loop: sweeps and reconciliation passes run only as
	// steps, so reconcileOne runs on the test's goroutine, between steps.
	db, err := pebblestore.Open("db", pebblefs.With(&pebblestore.Options{SweepInterval: -1, Lease: opsLease, TTL: opsTTL,
		InlineBodyBytes: opsInlineBody, MaxBodyBytes: opsMaxBody,
		Now: h.clock.Now, Reconcile: h.reconcileOne, Logger: slog.New(slog.DiscardHandler),
	}, h.fs))
	require.NoError(h.t, err)
	h.db = db
	h.epoch++
	h.counts = idem.Metrics{}
}

func (h *opsHarness) close() {
	h.requireSound()
	require.NoError(h.t, h.db.Close())
}

// requireSound fails the run unless DB.Check finds every record agreeing
// with its index entries and body chunks.
func (h *opsHarness) requireSound() {
	res, err := h.db.Check(h.ctx)
	require.NoError(h.t, err)
	require.True(h.t, res.OK(), "%v", res.Problems)
}

func (h *opsHarness) scope(k int) idem.Scope {
	return idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: fmt.Sprint("key-", k)}
}

func fingerprint(fp int) idem.Fingerprint { return sha256.Sum256([]byte{byte(fp)}) }

// live returns the model's record for k if it has not expired.
func (h *opsHarness) live(k int) *modelRecord {
	m := h.model[k]
	if m == nil || !h.clock.Now().Before(m.expiresAt) {
		return nil
	}
	return m
}

// step runs one operation; arg picks its key and its variant.
func (h *opsHarness) step(op, arg int) {
	k := arg % opsKeys
	switch op {
	case 0, 1, 2:
		h.claim(k, arg/opsKeys%2)
	case 3:
		status := []int{200, 201, 409, 500}[arg/opsKeys%4]
		body := opsBodies[arg/opsKeys/4%len(opsBodies)]
		h.end(k, arg, "complete", func(l idem.Lease) error {
			return l.Complete(h.ctx, idem.Response{Status: status, Body: body})
		}, func(m *modelRecord) { h.completed(m, status, body) })
	case 4:
		h.end(k, arg, "release", func(l idem.Lease) error { return l.Release(h.ctx) },
			func(*modelRecord) { h.released(k) })
	case 5:
		state, end := idem.StateUnknown, (idem.Lease).MarkUnknown
		if arg/opsKeys%2 == 1 {
			state, end = idem.StateFailed, (idem.Lease).MarkFailed
		}
		h.end(k, arg, state.String(), func(l idem.Lease) error { return end(l, h.ctx) },
			func(m *modelRecord) { h.settled(m, state) })
	case 6:
		h.end(k, arg, "extend", func(l idem.Lease) error { return l.Extend(h.ctx) },
			func(m *modelRecord) { m.leaseUntil = h.clock.Now().Add(opsLease) })
	case 7:
		// Steps that land inside a lease, on its end exactly, past it,
		// and past the TTL.
		d := []time.Duration{time.Millisecond, 400 * time.Millisecond, opsLease, 3 * opsLease, opsTTL}[arg%5]
		h.clock.Advance(d)
	case 8:
		if arg%2 == 0 {
			h.sweep()
		} else {
			h.crash(arg / 2 % 101)
		}
	case 9:
		h.get(k)
	case 10:
		h.takeOver(k)
	case 11:
		h.reconcile(arg)
	case 12:
		h.checkMetrics()
	}
}

// The model's side of each way a lease ends, shared by the harness's own
// leases and the reconciler's.
func (h *opsHarness) completed(m *modelRecord, status int, body []byte) {
	m.state, m.leaseUntil, m.status = idem.StateCompleted, h.clock.Now(), status
	m.body, m.omitted = body, len(body) > opsMaxBody
	h.counts.Events[idem.EventCompleted]++
}

func (h *opsHarness) released(k int) {
	h.model[k] = nil
	h.counts.Events[idem.EventReleased]++
}

func (h *opsHarness) settled(m *modelRecord, state idem.State) {
	m.state, m.leaseUntil = state, h.clock.Now()
	if state == idem.StateUnknown {
		h.counts.Events[idem.EventUnknown]++
	} else {
		h.counts.Events[idem.EventFailed]++
	}
}

// grant records a new lease on k, which every earlier one loses.
func (h *opsHarness) grant(k int, m *modelRecord, l idem.Lease) {
	h.nextID++
	h.leases[k] = append(h.leases[k], opsLeaseEntry{lease: l, id: h.nextID, epoch: h.epoch})
	m.state, m.leaseUntil, m.owner = idem.StateInProgress, h.clock.Now().Add(opsLease), h.nextID
}

// sweep deletes what has expired, records whose expiry is now included;
// the model forgets them too, so that the metrics stop counting them.
func (h *opsHarness) sweep() {
	res, err := h.db.Sweep(h.ctx)
	require.NoError(h.t, err)
	swept := 0
	for k, m := range h.model {
		if m != nil && !h.clock.Now().Before(m.expiresAt) {
			h.model[k] = nil
			swept++
		}
	}
	require.Equal(h.t, swept, res.Records, "records swept")
	h.counts.Events[idem.EventSwept] += int64(swept)
}

// The reconciler's choices for an overdue record.
const (
	reconcileComplete = iota
	reconcileRelease
	reconcileUnknown
	reconcileLeave // returns without resolving
	reconcileFail  // returns an error
	reconcileChoices
)

// reconcile runs a pass in which arg picks what the reconciler does with
// each key, and checks that it was handed exactly the live records past
// their lease.
func (h *opsHarness) reconcile(arg int) {
	var want []int
	for k := range opsKeys {
		if m := h.live(k); m != nil && m.state == idem.StateInProgress && !h.clock.Now().Before(m.leaseUntil) {
			want = append(want, k)
		}
	}
	var got []int
	wantResolved := 0
	h.decide = func(k int) int {
		got = append(got, k)
		d := arg
		for range k {
			d /= reconcileChoices
		}
		if d%reconcileChoices <= reconcileUnknown {
			wantResolved++
		}
		return d % reconcileChoices
	}
	res, err := h.db.Reconcile(h.ctx)
	h.decide = nil
	require.NoError(h.t, err)
	require.ElementsMatch(h.t, want, got, "keys handed to the reconciler")
	require.Equal(h.t, idem.ReconcileResult{Overdue: len(want), Resolved: wantResolved}, res)
	h.counts.Events[idem.EventReconciled] += int64(wantResolved)
}

// reconcileOne is the store's Options.Reconcile: it takes the lease the
// pass granted as the harness's own, then does what decide says.
func (h *opsHarness) reconcileOne(ctx context.Context, l idem.Lease) error {
	require.NotNil(h.t, h.decide, "the reconciler ran outside a pass")
	var k int
	_, err := fmt.Sscanf(l.Record().Scope.Key, "key-%d", &k)
	require.NoError(h.t, err)
	m := h.live(k)
	require.NotNil(h.t, m, "key %d handed to the reconciler is not live", k)
	h.grant(k, m, l)
	h.counts.Events[idem.EventTakenOver]++
	switch h.decide(k) {
	case reconcileComplete:
		require.NoError(h.t, l.Complete(ctx, idem.Response{Status: 200, Body: opsBodies[2]}))
		h.completed(m, 200, opsBodies[2])
	case reconcileRelease:
		require.NoError(h.t, l.Release(ctx))
		h.released(k)
	case reconcileUnknown:
		require.NoError(h.t, l.MarkUnknown(ctx))
		h.settled(m, idem.StateUnknown)
	case reconcileFail:
		return errors.New("provider unreachable")
	}
	return nil
}

// checkMetrics compares the store's metrics with the model: its event
// counts since it opened and the records it holds that are not completed,
// expired ones included until a sweep removes them.
func (h *opsHarness) checkMetrics() {
	got, err := h.db.Metrics(context.Background())
	require.NoError(h.t, err)
	now := h.clock.Now()
	want := h.counts
	for _, m := range h.model {
		if m == nil {
			continue
		}
		switch m.state {
		case idem.StateInProgress:
			want.InProgress++
			if !now.Before(m.leaseUntil) {
				want.Overdue++
			}
			want.OldestInProgress = max(want.OldestInProgress, now.Sub(m.createdAt))
		case idem.StateUnknown:
			want.UnknownRecords++
		case idem.StateFailed:
			want.FailedRecords++
		}
		if !now.Before(m.expiresAt) {
			want.Expired++
		}
	}
	// What the model does not keep: the bytes sweeps reclaimed, group
	// commit and Pebble's own figures.
	want.BytesReclaimed, want.Engine = got.BytesReclaimed, got.Engine
	require.Equal(h.t, want, got)
}

// claim checks a claim's answer against the model, and records its lease.
func (h *opsHarness) claim(k, fp int) {
	t, now := h.t, h.clock.Now()
	l, rec, err := h.db.Claim(h.ctx, h.scope(k), fingerprint(fp))
	m := h.live(k)
	switch {
	case m == nil:
		require.NoError(t, err, "claim of a free key %d", k)
		require.NotNil(t, l)
		require.Nil(t, rec)
		h.nextID++
		h.leases[k] = append(h.leases[k], opsLeaseEntry{lease: l, id: h.nextID, epoch: h.epoch})
		h.model[k] = &modelRecord{fp: fp, state: idem.StateInProgress, leaseUntil: now.Add(opsLease), expiresAt: now.Add(opsTTL), owner: h.nextID, createdAt: now}
		h.counts.Events[idem.EventClaimed]++
	case m.fp != fp:
		require.ErrorIs(t, err, idem.ErrFingerprintMismatch, "key %d holds fingerprint %d, claimed with %d", k, m.fp, fp)
		h.counts.Events[idem.EventMismatch]++
	case m.state == idem.StateCompleted:
		require.NoError(t, err, "replay of key %d", k)
		require.Nil(t, l)
		require.NotNil(t, rec)
		h.checkRecord(k, m, rec)
		h.counts.Events[idem.EventReplayed]++
	case m.state == idem.StateInProgress && now.Before(m.leaseUntil):
		require.ErrorIs(t, err, idem.ErrInProgress, "key %d is held", k)
		h.counts.Events[idem.EventConflict]++
	default:
		require.ErrorIs(t, err, idem.ErrOutcomePending, "key %d is %s", k, m.state)
		h.counts.Events[idem.EventPending]++
	}
}

// takeOver checks an operator's takeover of k against the model: only a
// record whose outcome is unsettled and that nobody may still be working
// on gets a new lease, which the earlier ones lose.
func (h *opsHarness) takeOver(k int) {
	t, now := h.t, h.clock.Now()
	l, err := h.db.TakeOver(h.ctx, h.scope(k))
	m := h.live(k)
	switch {
	case m == nil:
		require.ErrorIs(t, err, idem.ErrNotFound, "takeover of a free key %d", k)
	case m.state == idem.StateCompleted:
		require.ErrorIs(t, err, idem.ErrCompleted, "takeover of completed key %d", k)
	case m.state == idem.StateInProgress && now.Before(m.leaseUntil):
		require.ErrorIs(t, err, idem.ErrInProgress, "takeover of held key %d", k)
	default:
		require.NoError(t, err, "takeover of key %d, %s", k, m.state)
		require.NotNil(t, l)
		h.grant(k, m, l)
		h.counts.Events[idem.EventTakenOver]++
	}
}

// end runs a lease method on the newest lease of k, or on an older one when
// arg says so, and checks that it is refused exactly when the model says
// the lease no longer holds the record; if it is not, apply makes the same
// change to the model.
func (h *opsHarness) end(k, arg int, what string, call func(idem.Lease) error, apply func(*modelRecord)) {
	ls := h.leases[k]
	if len(ls) == 0 {
		return
	}
	e := ls[len(ls)-1]
	if arg/opsKeys/20%2 == 1 {
		e = ls[arg/opsKeys%len(ls)]
	}
	m := h.live(k)
	err := call(e.lease)
	switch {
	case e.epoch != h.epoch:
		require.ErrorIs(h.t, err, idem.ErrClosed, "%s with a lease from before a crash", what)
	case m == nil || m.owner != e.id || m.state != idem.StateInProgress:
		require.ErrorIs(h.t, err, idem.ErrLeaseLost, "%s with a lease that no longer holds key %d", what, k)
	default:
		require.NoError(h.t, err, "%s of key %d", what, k)
		apply(m)
	}
}

// get checks what Get returns for k.
func (h *opsHarness) get(k int) {
	rec, err := h.db.Get(h.ctx, h.scope(k))
	m := h.live(k)
	if m == nil {
		require.ErrorIs(h.t, err, idem.ErrNotFound, "key %d", k)
		return
	}
	require.NoError(h.t, err, "key %d", k)
	h.checkRecord(k, m, rec)
}

// checkRecord compares a record the store returned with the model's.
func (h *opsHarness) checkRecord(k int, m *modelRecord, rec *idem.Record) {
	t := h.t
	require.Equal(t, m.state, rec.State, "key %d", k)
	require.Equal(t, fingerprint(m.fp), rec.Fingerprint, "key %d", k)
	require.True(t, m.leaseUntil.Equal(rec.LeaseUntil), "key %d lease until %s, stored %s", k, m.leaseUntil, rec.LeaseUntil)
	require.True(t, m.expiresAt.Equal(rec.ExpiresAt), "key %d expires at %s, stored %s", k, m.expiresAt, rec.ExpiresAt)
	if m.state != idem.StateCompleted {
		return
	}
	require.Equal(t, m.status, rec.Response.Status, "key %d", k)
	require.Equal(t, m.omitted, rec.BodyOmitted, "key %d", k)
	require.Equal(t, int64(len(m.body)), rec.BodyLen, "key %d", k)
	require.Equal(t, sha256.Sum256(m.body), rec.BodyDigest, "key %d", k)
	want := m.body
	if m.omitted {
		want = nil
	}
	if !bytes.Equal(want, rec.Response.Body) {
		t.Fatalf("key %d answered a body of %d bytes, stored %d", k, len(rec.Response.Body), len(want))
	}
}

// crash takes a crash image of the filesystem, with unsynced percent of
// what was not synced surviving, and reopens the store on it. Every answer
// before it was acknowledged, so the model stands; its leases do not.
func (h *opsHarness) crash(unsynced int) {
	h.crashes++
	image := h.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(h.crashes, 5))})
	require.NoError(h.t, h.db.Close())
	h.fs = image
	h.open()
	h.requireSound()
}
