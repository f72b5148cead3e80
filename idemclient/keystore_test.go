package idemclient_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemclient"
	"github.com/idemkv/idem/internal/idemtest"
)

// TestKeyStores checks the KeyStore contract on both implementations.
// keyStores are the stores every key-store test runs on; the DB store
// keeps its keys under namespace ns.
func keyStores(ns string) []struct {
	name string
	open func(t *testing.T) lookupStore
} {
	return []struct {
		name string
		open func(t *testing.T) lookupStore
	}{
		{name: "memory", open: func(*testing.T) lookupStore { return &idemclient.MemoryKeyStore{} }},
		{name: "db", open: func(t *testing.T) lookupStore {
			db, _ := idemtest.Open(t, nil)
			return idemclient.NewStoreKeyStore(db, ns)
		}},
	}
}

func TestKeyStores(t *testing.T) {
	for _, tt := range keyStores("ns") {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := tt.open(t)

			_, _, err := s.Lookup(ctx, "op-1")
			require.ErrorIs(t, err, idemclient.ErrUnknownOperation)
			require.ErrorIs(t, s.Done(ctx, "op-1", 201), idemclient.ErrUnknownOperation)

			got, err := s.Save(ctx, "op-1", "key-a")
			require.NoError(t, err)
			assert.Equal(t, "key-a", got)
			got, err = s.Save(ctx, "op-1", "key-b")
			require.NoError(t, err)
			assert.Equal(t, "key-a", got, "the first key stays")

			key, status, err := s.Lookup(ctx, "op-1")
			require.NoError(t, err)
			assert.Equal(t, "key-a", key)
			assert.Equal(t, 0, status)

			require.NoError(t, s.Done(ctx, "op-1", 201))
			require.NoError(t, s.Done(ctx, "op-1", 500))
			key, status, err = s.Lookup(ctx, "op-1")
			require.NoError(t, err)
			assert.Equal(t, "key-a", key, "done keeps the key")
			assert.Equal(t, 201, status, "the first status stands")

			got, err = s.Save(ctx, "op-1", "key-c")
			require.NoError(t, err)
			assert.Equal(t, "key-a", got, "a done operation still resends its key")
		})
	}
}

// TestKeyStoreConcurrentSave: callers racing to start one operation never
// end up with two keys.
func TestKeyStoreConcurrentSave(t *testing.T) {
	for _, tt := range keyStores("") {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.open(t)
			var mu sync.Mutex
			keys := map[string]bool{}
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					k, err := s.Save(context.Background(), "op", "key-"+string(rune('a'+i)))
					if err != nil {
						// The DB store refuses a Save that overlaps another.
						assert.ErrorIs(t, err, idem.ErrInProgress)
						return
					}
					mu.Lock()
					keys[k] = true
					mu.Unlock()
				})
			}
			wg.Wait()
			assert.Len(t, keys, 1)
		})
	}
}

func TestStoreKeyStoreNamespaces(t *testing.T) {
	ctx := context.Background()
	db, _ := idemtest.Open(t, nil)
	a := idemclient.NewStoreKeyStore(db, "client-a")
	b := idemclient.NewStoreKeyStore(db, "client-b")
	_, err := a.Save(ctx, "op", "key-a")
	require.NoError(t, err)
	_, _, err = b.Lookup(ctx, "op")
	require.ErrorIs(t, err, idemclient.ErrUnknownOperation)
	got, err := b.Save(ctx, "op", "key-b")
	require.NoError(t, err)
	assert.Equal(t, "key-b", got)

	_, err = a.Save(ctx, strings.Repeat("x", idem.MaxKeyBytes+1), "k")
	require.ErrorIs(t, err, idem.ErrInvalidScope, "operation names are limited like keys")
}

func TestStoreKeyStoreClosed(t *testing.T) {
	db, _ := idemtest.Open(t, nil)
	s := idemclient.NewStoreKeyStore(db, "ns")
	require.NoError(t, db.Close())
	_, err := s.Save(context.Background(), "op", "k")
	require.ErrorIs(t, err, idem.ErrClosed)
}
