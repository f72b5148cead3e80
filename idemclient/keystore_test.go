package idemclient_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemclient"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// TestMain stops the PostgreSQL that pgtest may start for the key store
// kept in pgstore.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// lookupStore is a KeyStore that can also be read back, as both of the
// package's stores can.
type lookupStore interface {
	idemclient.KeyStore
	Lookup(ctx context.Context, op string) (string, int, error)
}

// keyStoreOpener returns an empty store and restart, which stops it and
// returns the same store as a new process would find it.
type keyStoreOpener func(t testing.TB) (s idemclient.KeyStore, restart func() idemclient.KeyStore)

// keyStoreImpl is one KeyStore implementation under test.
type keyStoreImpl struct {
	name string
	open keyStoreOpener
}

// keyStoreImpls are the package's stores: in memory, where a restart is a
// new Transport in the same process, and in a DB on an in-memory
// filesystem, where a restart closes the DB and opens it again, with and
// without a namespace. StoreKeyStore takes any idem.Store, so it is
// also tried on PostgreSQL, where a restart closes the pgstore.Store and
// opens another on the same database.
func keyStoreImpls() []keyStoreImpl {
	inDB := func(ns string) keyStoreOpener {
		return func(t testing.TB) (idemclient.KeyStore, func() idemclient.KeyStore) {
			fs := vfs.NewMem()
			db, _ := idemtest.OpenFS(t, fs, nil)
			return idemclient.NewStoreKeyStore(db, ns), func() idemclient.KeyStore {
				require.NoError(t, db.Close()) // the process stops
				db, _ = idemtest.OpenFS(t, fs, nil)
				return idemclient.NewStoreKeyStore(db, ns)
			}
		}
	}
	return []keyStoreImpl{
		{name: "memory", open: func(testing.TB) (idemclient.KeyStore, func() idemclient.KeyStore) {
			s := &idemclient.MemoryKeyStore{}
			return s, func() idemclient.KeyStore { return s }
		}},
		{name: "db", open: inDB("client-a")},
		{name: "db without namespace", open: inDB("")},
		{name: "postgres", open: func(t testing.TB) (idemclient.KeyStore, func() idemclient.KeyStore) {
			dsn := pgtest.DSN(t)
			open := func() *pgstore.Store {
				db, err := pgstore.Open(context.Background(), dsn, nil)
				require.NoError(t, err)
				t.Cleanup(func() { db.Close() })
				return db
			}
			db := open()
			return idemclient.NewStoreKeyStore(db, "client-a"), func() idemclient.KeyStore {
				require.NoError(t, db.Close()) // the process stops
				db = open()
				return idemclient.NewStoreKeyStore(db, "client-a")
			}
		}},
	}
}

// keyStoreChecks are the KeyStore contract, as its doc states it, one
// promise per check. They report on a testing.TB so that
// TestKeyStoreChecksCatchBrokenStores can run them on stores that break it.
// What a store's Lookup reports is checked when it has one.
var keyStoreChecks = []struct {
	name string
	run  func(t testing.TB, open keyStoreOpener)
}{
	{"unknown operation", func(t testing.TB, open keyStoreOpener) {
		ctx := context.Background()
		s, _ := open(t)
		if ls, ok := s.(lookupStore); ok {
			_, _, err := ls.Lookup(ctx, "op-1")
			require.ErrorIs(t, err, idemclient.ErrUnknownOperation)
		}
		require.ErrorIs(t, s.Done(ctx, "op-1", 201), idemclient.ErrUnknownOperation)
		got, err := s.Save(ctx, "op-1", "key-a")
		require.NoError(t, err)
		assert.Equal(t, "key-a", got, "a failed Done gives the operation no key")
	}},
	{"the first key stays", func(t testing.TB, open keyStoreOpener) {
		ctx := context.Background()
		s, _ := open(t)
		got, err := s.Save(ctx, "op-1", "key-a")
		require.NoError(t, err)
		assert.Equal(t, "key-a", got)
		got, err = s.Save(ctx, "op-1", "key-b")
		require.NoError(t, err)
		assert.Equal(t, "key-a", got, "the first key stays")
		if ls, ok := s.(lookupStore); ok {
			key, status, err := ls.Lookup(ctx, "op-1")
			require.NoError(t, err)
			assert.Equal(t, "key-a", key)
			assert.Equal(t, 0, status)
		}
	}},
	{"operations are independent", func(t testing.TB, open keyStoreOpener) {
		ctx := context.Background()
		s, _ := open(t)
		_, err := s.Save(ctx, "op-1", "key-a")
		require.NoError(t, err)
		got, err := s.Save(ctx, "op-2", "key-b")
		require.NoError(t, err)
		assert.Equal(t, "key-b", got)
		require.NoError(t, s.Done(ctx, "op-1", 201))
		require.ErrorIs(t, s.Done(ctx, "op-3", 201), idemclient.ErrUnknownOperation)
		got, err = s.Save(ctx, "op-2", "key-c")
		require.NoError(t, err)
		assert.Equal(t, "key-b", got)
	}},
	{"done keeps the key and the first status", func(t testing.TB, open keyStoreOpener) {
		ctx := context.Background()
		s, _ := open(t)
		_, err := s.Save(ctx, "op-1", "key-a")
		require.NoError(t, err)
		require.NoError(t, s.Done(ctx, "op-1", 201))
		require.NoError(t, s.Done(ctx, "op-1", 500))
		if ls, ok := s.(lookupStore); ok {
			key, status, err := ls.Lookup(ctx, "op-1")
			require.NoError(t, err)
			assert.Equal(t, "key-a", key, "done keeps the key")
			assert.Equal(t, 201, status, "the first status stands")
		}
		got, err := s.Save(ctx, "op-1", "key-c")
		require.NoError(t, err)
		assert.Equal(t, "key-a", got, "a done operation still resends its key")
	}},
	{"keys survive a restart", func(t testing.TB, open keyStoreOpener) {
		ctx := context.Background()
		s, restart := open(t)
		_, err := s.Save(ctx, "op-1", "key-a")
		require.NoError(t, err)
		_, err = s.Save(ctx, "op-2", "key-b")
		require.NoError(t, err)
		require.NoError(t, s.Done(ctx, "op-2", 201))
		s = restart()
		got, err := s.Save(ctx, "op-1", "key-x")
		require.NoError(t, err)
		assert.Equal(t, "key-a", got, "an open operation resumes with its key")
		got, err = s.Save(ctx, "op-2", "key-y")
		require.NoError(t, err)
		assert.Equal(t, "key-b", got, "a done operation resends its key")
		assert.NoError(t, s.Done(ctx, "op-1", 201), "the restarted store knows the operation")
	}},
	{"overlapping saves agree", func(t testing.TB, open keyStoreOpener) {
		s, _ := open(t)
		var mu sync.Mutex
		keys := map[string]bool{}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				k, err := s.Save(context.Background(), "op", fmt.Sprintf("key-%d", i))
				if err != nil {
					// A Save may fail rather than wait for another.
					assert.ErrorIs(t, err, idem.ErrInProgress)
					return
				}
				mu.Lock()
				keys[k] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		assert.Len(t, keys, 1, "one key won")
		got, err := s.Save(context.Background(), "op", "key-late")
		require.NoError(t, err)
		assert.True(t, keys[got], "the winner is the stored key")
	}},
}

func TestKeyStores(t *testing.T) {
	for _, impl := range keyStoreImpls() {
		t.Run(impl.name, func(t *testing.T) {
			for _, c := range keyStoreChecks {
				t.Run(c.name, func(t *testing.T) { c.run(t, impl.open) })
			}
		})
	}
}

// brokenKeyStore is a KeyStore in a map that breaks one promise of the
// contract, chosen by rule, to show that keyStoreChecks notice.
type brokenKeyStore struct {
	rule   string
	mu     sync.Mutex
	keys   map[string]string
	status map[string]int
}

func (s *brokenKeyStore) Save(_ context.Context, op, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.keys[op]; ok && s.rule != "last key wins" {
		return k, nil
	}
	s.keys[op] = key
	return key, nil
}

func (s *brokenKeyStore) Done(_ context.Context, op string, status int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.keys[op]; !ok && s.rule != "done without a key" {
		return idemclient.ErrUnknownOperation
	}
	if _, ok := s.status[op]; !ok || s.rule == "last status wins" {
		s.status[op] = status
	}
	if s.rule == "done forgets the key" {
		delete(s.keys, op)
	}
	return nil
}

func (s *brokenKeyStore) Lookup(_ context.Context, op string) (string, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[op]
	if !ok {
		return "", 0, idemclient.ErrUnknownOperation
	}
	return k, s.status[op], nil
}

// failures is a testing.TB that records failures instead of failing the
// test. FailNow ends the goroutine, as testing.T's does; run the checks
// through failures.run.
type failures struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (f *failures) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, fmt.Sprintf(format, args...))
}
func (f *failures) Error(args ...any)                 { f.Errorf("%s", fmt.Sprint(args...)) }
func (f *failures) Fail()                             { f.Errorf("failed") }
func (f *failures) FailNow()                          { f.Fail(); runtime.Goexit() }
func (f *failures) Fatal(args ...any)                 { f.Error(args...); runtime.Goexit() }
func (f *failures) Fatalf(format string, args ...any) { f.Errorf(format, args...); runtime.Goexit() }
func (f *failures) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.failed) > 0
}

// run runs check on its own goroutine, which FailNow may end, and waits.
func (f *failures) run(check func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		check()
	}()
	<-done
}

// TestKeyStoreChecksCatchBrokenStores: a store that breaks any one
// promise fails at least one check, so a store that passes them all keeps
// the contract as far as the checks can tell.
func TestKeyStoreChecksCatchBrokenStores(t *testing.T) {
	for rule, want := range map[string]string{
		"last key wins":        "the first key stays",
		"done without a key":   "unknown operation",
		"last status wins":     "done keeps the key and the first status",
		"done forgets the key": "done keeps the key and the first status",
		"forgets on restart":   "keys survive a restart",
	} {
		t.Run(rule, func(t *testing.T) {
			open := func(testing.TB) (idemclient.KeyStore, func() idemclient.KeyStore) {
				s := &brokenKeyStore{rule: rule, keys: map[string]string{}, status: map[string]int{}}
				return s, func() idemclient.KeyStore {
					if rule == "forgets on restart" {
						return &brokenKeyStore{rule: rule, keys: map[string]string{}, status: map[string]int{}}
					}
					return s
				}
			}
			var caught []string
			for _, c := range keyStoreChecks {
				f := &failures{TB: t}
				f.run(func() { c.run(f, open) })
				if f.Failed() {
					caught = append(caught, c.name)
				}
			}
			assert.Contains(t, caught, want)
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
