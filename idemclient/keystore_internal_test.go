package idemclient

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

// TestStoreKeyStoreReconcile: a process that stopped between claiming a key
// record and completing it blocks the operation name until the DB's
// reconciler hands the record to StoreKeyStore.Reconcile, which frees it.
func TestStoreKeyStoreReconcile(t *testing.T) {
	ctx := context.Background()
	var store *StoreKeyStore
	var foreign int
	db, clock := idemtest.Open(t, &pebblestore.Options{Reconcile: func(ctx context.Context, l idem.Lease) error {
		ok, err := store.Reconcile(ctx, l)
		if !ok {
			foreign++
		}
		return err
	}})
	store = NewStoreKeyStore(db, "ns")

	// The crash: claimed, never completed.
	lease, _, err := db.Claim(ctx, store.scope(KeyEndpoint, "op"), keyFingerprint)
	require.NoError(t, err)
	require.NotNil(t, lease)
	// Someone else's record in the same DB, left alone.
	_, _, err = db.Claim(ctx, idem.Scope{Tenant: "ns", Endpoint: "POST /other", Key: "k"}, keyFingerprint)
	require.NoError(t, err)

	_, err = store.Save(ctx, "op", "key-new")
	require.ErrorIs(t, err, idem.ErrInProgress)
	_, _, err = store.Lookup(ctx, "op")
	require.ErrorIs(t, err, ErrUnknownOperation, "a half-saved key was never sent")

	clock.Advance(time.Minute)
	_, err = store.Save(ctx, "op", "key-new")
	require.ErrorIs(t, err, idem.ErrOutcomePending)

	res, err := db.Reconcile(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, res.Overdue)
	assert.Equal(t, 1, res.Resolved)
	assert.Equal(t, 1, foreign)

	got, err := store.Save(ctx, "op", "key-new")
	require.NoError(t, err)
	assert.Equal(t, "key-new", got)
}
