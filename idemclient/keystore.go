package idemclient

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/idemkv/idem"
)

// KeyStore keeps the key of each named operation (see WithOperation)
// across restarts of the client, so that an operation cut off by a crash
// is resumed with the key it was first sent with and the server replays
// its outcome instead of running it again. MemoryKeyStore and
// StoreKeyStore implement it. An implementation of your own must keep
// the promises in this comment: the Transport relies on each of them.
//
// It must be safe for concurrent use: a Transport calls it from every
// goroutine that sends a request.
//
// The Transport calls it only for requests that carry an operation name,
// so op is never empty, and key is never empty either. An implementation
// may bound their lengths and refuse longer ones with an error
// (StoreKeyStore takes names of at most idem.MaxKeyBytes).
//
// Both methods should give up when ctx is done and return its error.
type KeyStore interface {
	// Save returns the key of operation op: the key that every attempt of
	// op sends, in this process and in any later one.
	//
	// The first Save of op stores key and returns it, and returns only
	// once key is durable: kept as long as the store keeps anything
	// (across a crash, for a store meant to survive one). The
	// Transport sends the key as soon as Save returns; a key the server
	// has seen but the store then lost would let a restarted client run
	// the operation a second time under a new key.
	//
	// Every later Save of op, before or after Done, returns the stored
	// key with a nil error and ignores its key argument: an operation's
	// key never changes. The Transport refuses a request whose own key
	// header disagrees with the stored key. Operations are independent of
	// one another.
	//
	// Saves of one operation that overlap must agree: every one that
	// succeeds returns the same key. A Save may instead fail, with an
	// error matching idem.ErrInProgress, because another is under
	// way, as StoreKeyStore's does rather than wait.
	//
	// When Save fails the Transport sends nothing and returns the error
	// inside a *RetryError. A key stored by a Save that then failed was
	// never sent, so a later Save may return it or replace it.
	Save(ctx context.Context, op, key string) (string, error)

	// Done records that op received a definitive response (see
	// Options.Definitive) with status, for the application to read back
	// (both stores here have a Lookup method for that). The first Done of
	// op records status; a later one returns nil and changes nothing. A
	// Done that overlaps another of the same operation may fail instead.
	//
	// Done does not forget the key: a later Save of op returns it, so a
	// request sent again under the same name gets the server's stored
	// outcome, not a second run.
	//
	// Done of an operation that has no key fails with an error matching
	// ErrUnknownOperation.
	//
	// The Transport calls Done with a context that the request's
	// cancellation does not reach, and only logs its error: the response
	// has arrived and goes to the caller, and an operation left open only
	// means that sending it again replays. Done's record should be durable
	// when it returns, but losing it does no harm beyond that.
	Done(ctx context.Context, op string, status int) error
}

// ErrUnknownOperation: the key store holds no key for the operation.
// KeyStore.Done and the stores' Lookup methods return it, wrapped.
var ErrUnknownOperation = errors.New("idemclient: unknown operation")

// MemoryKeyStore is a KeyStore in memory, for tests and for processes in
// which a Transport may be rebuilt but the process lives on: its keys last
// as long as the process. The zero value is an empty store ready to use.
// It is safe for concurrent use.
type MemoryKeyStore struct {
	mu  sync.Mutex
	ops map[string]memOp // guarded by mu
}

type memOp struct {
	key    string
	status int
}

// Save implements KeyStore.
func (s *MemoryKeyStore) Save(_ context.Context, op, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.ops[op]; ok {
		return o.key, nil
	}
	if s.ops == nil {
		s.ops = make(map[string]memOp)
	}
	s.ops[op] = memOp{key: key}
	return key, nil
}

// Done implements KeyStore. It fails with ErrUnknownOperation if op has no
// key.
func (s *MemoryKeyStore) Done(_ context.Context, op string, status int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.ops[op]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownOperation, op)
	}
	if o.status == 0 {
		o.status = status
		s.ops[op] = o
	}
	return nil
}

// Lookup returns op's key and, once it is done, its definitive status (0
// before). It fails with ErrUnknownOperation if op has no key.
func (s *MemoryKeyStore) Lookup(_ context.Context, op string) (key string, status int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.ops[op]
	if !ok {
		return "", 0, fmt.Errorf("%w: %q", ErrUnknownOperation, op)
	}
	return o.key, o.status, nil
}

// Endpoints under which StoreKeyStore keeps its records, so that a DB's
// Options.EndpointTTL can give them their own lifetime.
const (
	// KeyEndpoint holds one record per operation whose body is its key.
	KeyEndpoint = "idemclient.key"
	// DoneEndpoint holds one record per finished operation whose status
	// is the definitive status.
	DoneEndpoint = "idemclient.done"
)

// The fingerprints of the two kinds of record. Each is fixed, so that a
// second claim of an operation's record finds the first one completed and
// reads it back, instead of being refused as a different request.
var (
	keyFingerprint  idem.Fingerprint = sha256.Sum256([]byte("idemclient key record v1"))
	doneFingerprint idem.Fingerprint = sha256.Sum256([]byte("idemclient done record v1"))
)

// StoreKeyStore is a KeyStore kept in an idem DB, the embedded store the
// server side uses, so a client gets the same durability (every write is
// synced before it returns) without another database. It is safe for
// concurrent use.
//
// It uses only the DB's claim API. An operation's key is one record in
// scope (namespace, KeyEndpoint, operation): the first Save claims it and
// completes it with the key as the body, and every later Save's claim
// finds that record and reads the key from it. Claims of one scope are
// serialized by the DB, so two callers saving the same operation cannot
// both win. Completed records are never overwritten, so "done" cannot be a
// change to the key record; it is a second record in (namespace,
// DoneEndpoint, operation) completed with the status.
//
// Records expire with the DB's TTL (Options.TTL, or Options.EndpointTTL
// for KeyEndpoint and DoneEndpoint). After that, the operation's name gets
// a new key; keep the TTL longer than you would ever retry an operation,
// and no longer than the server remembers keys.
//
// A process that stops between claiming a key record and completing it
// leaves the record in progress, and later Saves of that operation fail
// until it is resolved. No key was sent for it, since the Transport sends
// only after Save returns, so it is safe to drop: call Reconcile from the
// DB's Options.Reconcile.
type StoreKeyStore struct {
	db        idem.Store
	namespace string
}

// NewStoreKeyStore returns a KeyStore that keeps its records in db under the
// tenant namespace, which keeps clients that share one DB apart (at most
// idem.MaxTenantBytes; may be empty). Operation names are the records'
// keys, so they must be 1 to idem.MaxKeyBytes bytes long.
func NewStoreKeyStore(db idem.Store, namespace string) *StoreKeyStore {
	return &StoreKeyStore{db: db, namespace: namespace}
}

func (s *StoreKeyStore) scope(endpoint, op string) idem.Scope {
	return idem.Scope{Tenant: s.namespace, Endpoint: endpoint, Key: op}
}

// Save implements KeyStore. It fails with an error matching
// idem.ErrInProgress if another caller is saving op at the same moment.
func (s *StoreKeyStore) Save(ctx context.Context, op, key string) (string, error) {
	lease, rec, err := s.db.Claim(ctx, s.scope(KeyEndpoint, op), keyFingerprint)
	if err != nil {
		return "", fmt.Errorf("idemclient: claim key record: %w", err)
	}
	if rec != nil {
		return string(rec.Response.Body), nil
	}
	if err := lease.Complete(ctx, idem.Response{Status: http.StatusOK, Body: []byte(key)}); err != nil {
		// The key was never returned, so never sent: free the name again.
		_ = lease.Release(context.WithoutCancel(ctx))
		return "", fmt.Errorf("idemclient: store key: %w", err)
	}
	return key, nil
}

// Done implements KeyStore. It fails with ErrUnknownOperation if op has no
// key.
func (s *StoreKeyStore) Done(ctx context.Context, op string, status int) error {
	if _, _, err := s.Lookup(ctx, op); err != nil {
		return err
	}
	lease, _, err := s.db.Claim(ctx, s.scope(DoneEndpoint, op), doneFingerprint)
	if err != nil {
		return fmt.Errorf("idemclient: claim done record: %w", err)
	}
	if lease == nil {
		return nil // done already; the first status stands
	}
	if err := lease.Complete(ctx, idem.Response{Status: status}); err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return fmt.Errorf("idemclient: store done record: %w", err)
	}
	return nil
}

// Lookup returns op's key and, once it is done, its definitive status (0
// before). It fails with ErrUnknownOperation if op has no key.
func (s *StoreKeyStore) Lookup(ctx context.Context, op string) (key string, status int, err error) {
	rec, err := s.completed(ctx, KeyEndpoint, op)
	if err != nil {
		return "", 0, err
	}
	if rec == nil {
		return "", 0, fmt.Errorf("%w: %q", ErrUnknownOperation, op)
	}
	key = string(rec.Response.Body)
	if rec, err = s.completed(ctx, DoneEndpoint, op); err != nil || rec == nil {
		return key, 0, err
	}
	return key, rec.Response.Status, nil
}

// completed returns the completed record of op under endpoint, or nil if
// there is none. A record still in progress counts as none: its Save or
// Done never returned.
func (s *StoreKeyStore) completed(ctx context.Context, endpoint, op string) (*idem.Record, error) {
	rec, err := s.db.Get(ctx, s.scope(endpoint, op))
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("idemclient: read %s record: %w", endpoint, err)
	case rec.State != idem.StateCompleted:
		return nil, nil
	}
	return rec, nil
}

// Reconcile releases l if it is one of this store's records, and reports
// whether it was. Call it first from the DB's Options.Reconcile, so that a
// key record left in progress by a crash frees its operation name: no key
// was sent for it. Other records are left to the rest of the reconciler.
func (s *StoreKeyStore) Reconcile(ctx context.Context, l idem.Lease) (bool, error) {
	sc := l.Scope()
	if sc.Tenant != s.namespace || (sc.Endpoint != KeyEndpoint && sc.Endpoint != DoneEndpoint) {
		return false, nil
	}
	return true, l.Release(ctx)
}
