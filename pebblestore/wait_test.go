package pebblestore

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// TestWaitWakesOnLeaseEnd makes sure the waiter is registered before the
// lease ends, so that only a real wake-up can let it return.
func TestWaitWakesOnLeaseEnd(t *testing.T) {
	ctx := context.Background()
	s := idem.Scope{Tenant: "t", Endpoint: "e", Key: "k"}
	for name, end := range map[string]func(idem.Lease) error{
		"complete": func(l idem.Lease) error { return l.Complete(ctx, idem.Response{Status: 200}) },
		"release":  func(l idem.Lease) error { return l.Release(ctx) },
		"unknown":  func(l idem.Lease) error { return l.MarkUnknown(ctx) },
		"failed":   func(l idem.Lease) error { return l.MarkFailed(ctx) },
	} {
		t.Run(name, func(t *testing.T) {
			db, err := Open("db", &Options{fs: vfs.NewMem(), SweepInterval: -1})
			require.NoError(t, err)
			defer db.Close()
			l, _, err := db.Claim(ctx, s, idem.Fingerprint{1})
			require.NoError(t, err)
			woke := make(chan error, 1)
			go func() { woke <- db.Wait(ctx, s) }()
			for db.waiting.n.Load() == 0 {
				runtime.Gosched()
			}
			select {
			case err := <-woke:
				t.Fatalf("Wait returned while the lease was held: %v", err)
			default:
			}
			require.NoError(t, end(l))
			require.NoError(t, <-woke)
			assert.Zero(t, db.waiting.n.Load())
			_, _, err = db.Claim(ctx, s, idem.Fingerprint{1})
			assert.NotErrorIs(t, err, idem.ErrInProgress)
		})
	}
}

// TestLeaseCheckWhenTheStripeIsShared covers the slow path of a lease's
// ownership check: another key in the same stripe was written in between,
// so the lease must read its record back.
func TestLeaseCheckWhenTheStripeIsShared(t *testing.T) {
	ctx := context.Background()
	db, err := Open("db", &Options{fs: vfs.NewMem(), SweepInterval: -1})
	require.NoError(t, err)
	defer db.Close()
	a := idem.Scope{Tenant: "t", Endpoint: "e", Key: "a"}
	b := a
	for i := 0; ; i++ {
		b.Key = "b" + itoa(i)
		if db.rows.Stripe(recordKey(a)) == db.rows.Stripe(recordKey(b)) {
			break
		}
	}
	la, _, err := db.Claim(ctx, a, idem.Fingerprint{1})
	require.NoError(t, err)
	lb, _, err := db.Claim(ctx, b, idem.Fingerprint{1})
	require.NoError(t, err)
	require.NoError(t, lb.Complete(ctx, idem.Response{Status: 200}))
	require.NoError(t, la.Extend(ctx), "a neighbour's write does not cost a the lease")

	// A takeover of a, seen only through the read-back, must cost it.
	l := la.(*lease)
	db2lease := &lease{db: db, rk: l.rk, scope: a, rec: l.rec, val: l.val, writes: l.writes}
	require.NoError(t, la.MarkUnknown(ctx))
	assert.ErrorIs(t, db2lease.Complete(ctx, idem.Response{Status: 200}), idem.ErrLeaseLost)
}

func itoa(i int) string { return fmt.Sprint(i) }
