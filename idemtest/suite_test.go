package idemtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// brokenStoreEnv names, in a child process, the broken store that
// TestBrokenStoreChild runs the suite on.
const brokenStoreEnv = "IDEMTEST_BROKEN_STORE"

// brokenStores are MemStores with one promise of the contract broken each,
// and the subtests of TestStore that must fail on them. "faithful" breaks
// nothing: it shows that the child process passes when the store does.
var brokenStores = map[string]struct {
	wrap    func(m *MemStore) idem.Store
	maxBody int64 // the MemStore's body limit, where the suite is told the default
	fails   []string
}{
	"faithful": {
		wrap: func(m *MemStore) idem.Store { return m },
	},
	"second claimer wins": {
		wrap: func(m *MemStore) idem.Store { return secondWinner{m} },
		fails: []string{
			"claim/in_progress_asks_to_retry_within_the_lease",
			"concurrent_claims/one_winner_per_key",
		},
	},
	"mismatch replays": {
		wrap:  func(m *MemStore) idem.Store { return mismatchReplays{m} },
		fails: []string{"claim/completed_refuses_another_fingerprint"},
	},
	"complete overwrites": {
		wrap: func(m *MemStore) idem.Store {
			return leaseWrapper{m, func(l idem.Lease) idem.Lease { return overwritingLease{l, m} }}
		},
		fails: []string{
			"lease/complete/then/complete",
			"lease/lost_after_take-over",
			"lease/completed_responses_are_never_overwritten",
		},
	},
	"keeps less than its limit": {
		wrap:    func(m *MemStore) idem.Store { return m },
		maxBody: 1 << 20,
		fails:   []string{"bodies/at_the_limit"},
	},
	"keeps more than its limit": {
		wrap:    func(m *MemStore) idem.Store { return m },
		maxBody: 8 << 20,
		fails:   []string{"bodies/over_the_limit"},
	},
	"lost release succeeds": {
		wrap: func(m *MemStore) idem.Store {
			return leaseWrapper{m, func(l idem.Lease) idem.Lease { return lostReleaseLease{l} }}
		},
		fails: []string{
			"lease/complete/then/release",
			"lease/lost_after_release_and_a_new_claim",
		},
	},
}

// TestBrokenStoresFail shows that the suite catches each broken store: it
// runs TestBrokenStoreChild in a child process per store, since a failing
// TestStore would fail this test too, and expects the child to fail in
// the subtests that name the broken promise.
func TestBrokenStoresFail(t *testing.T) {
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range brokenStores {
			if !yield(name) {
				return
			}
		}
	})
	for _, name := range names {
		b := brokenStores[name]
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestBrokenStoreChild$", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenStoreEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if len(b.fails) == 0 {
				require.NoError(t, err, "the suite failed a store that keeps the contract:\n%s", out)
				return
			}
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the suite passed a broken store:\n%s", out)
			assert.NotZero(t, exit.ExitCode())
			for _, sub := range b.fails {
				assert.Contains(t, string(out), "--- FAIL: TestBrokenStoreChild/"+sub+" ", "the failure names the broken property")
			}
		})
	}
}

// TestBrokenStoreChild runs the suite on the broken store that the
// environment names; without one it does nothing.
func TestBrokenStoreChild(t *testing.T) {
	name := os.Getenv(brokenStoreEnv)
	if name == "" {
		return
	}
	b, ok := brokenStores[name]
	require.True(t, ok, "no broken store %q", name)
	TestStore(t, Limits{}, func(t *testing.T, now func() time.Time) idem.Store {
		m, err := NewMemStore(&MemOptions{Now: now, MaxBodyBytes: b.maxBody})
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		return b.wrap(m)
	})
}

// secondWinner hands a claim that finds the key held a lease of its own,
// taking the record from its holder: no mutual exclusion.
type secondWinner struct{ *MemStore }

func (w secondWinner) Claim(ctx context.Context, s idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	l, rec, err := w.MemStore.Claim(ctx, s, fp)
	if !errors.Is(err, idem.ErrInProgress) {
		return l, rec, err
	}
	m := w.MemStore
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.recs[s]
	if r == nil {
		return l, rec, err
	}
	m.tokens++
	r.token = m.tokens
	r.rec.LeaseUntil = m.now().Add(m.opts.Lease)
	return &memLease{m: m, scope: s, token: r.token, rec: cloneRecord(r.rec)}, nil, nil
}

// mismatchReplays answers a completed key's replay to any request, whatever
// its fingerprint.
type mismatchReplays struct{ *MemStore }

func (w mismatchReplays) Claim(ctx context.Context, s idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	l, rec, err := w.MemStore.Claim(ctx, s, fp)
	if errors.Is(err, idem.ErrFingerprintMismatch) {
		if stored, gerr := w.Get(ctx, s); gerr == nil && stored.State == idem.StateCompleted {
			return nil, stored, nil
		}
	}
	return l, rec, err
}

// leaseWrapper hands out the leases of its MemStore wrapped by wrap.
type leaseWrapper struct {
	*MemStore
	wrap func(idem.Lease) idem.Lease
}

func (w leaseWrapper) Claim(ctx context.Context, s idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	l, rec, err := w.MemStore.Claim(ctx, s, fp)
	if l != nil {
		l = w.wrap(l)
	}
	return l, rec, err
}

func (w leaseWrapper) TakeOver(ctx context.Context, s idem.Scope) (idem.Lease, error) {
	l, err := w.MemStore.TakeOver(ctx, s)
	if l != nil {
		l = w.wrap(l)
	}
	return l, err
}

// overwritingLease writes its response even after it lost the record,
// over whatever the record holds.
type overwritingLease struct {
	idem.Lease
	m *MemStore
}

func (l overwritingLease) Complete(ctx context.Context, resp idem.Response) error {
	err := l.Lease.Complete(ctx, resp)
	if !errors.Is(err, idem.ErrLeaseLost) {
		return err
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if r := l.m.recs[l.Scope()]; r != nil {
		r.rec.State = idem.StateCompleted
		r.rec.Response = idem.Response{Status: resp.Status, Header: cloneHeader(resp.Header), Body: slices.Clone(resp.Body)}
		r.rec.BodyLen = int64(len(resp.Body))
	}
	return nil
}

// lostReleaseLease reports success for a Release it was refused.
type lostReleaseLease struct{ idem.Lease }

func (l lostReleaseLease) Release(ctx context.Context) error {
	if err := l.Lease.Release(ctx); !errors.Is(err, idem.ErrLeaseLost) {
		return err
	}
	return nil
}
