package pgstore_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// txEnv is a database with a business table, payments, two stores on it
// (a and b, as two replicas) and a connection of its own that looks from
// outside every transaction under test.
type txEnv struct {
	dsn  string
	a, b *pgstore.Store
	look *pgx.Conn
}

// newTxEnv sets up a txEnv; opts, when not nil, adjusts both stores'
// options. Claims wait a minute for an open transaction unless opts says
// otherwise, so that only a broken store reaches the bound.
func newTxEnv(t *testing.T, opts func(o *pgstore.Options)) *txEnv {
	t.Helper()
	dsn := pgtest.DSN(t)
	mk := func() *pgstore.Options {
		o := &pgstore.Options{ClaimWait: time.Minute}
		if opts != nil {
			opts(o)
		}
		return o
	}
	e := &txEnv{dsn: dsn, a: open(t, dsn, mk()), b: open(t, dsn, mk()), look: connect(t, dsn)}
	_, err := e.look.Exec(t.Context(), `CREATE TABLE payments (key text PRIMARY KEY, amount int NOT NULL)`)
	require.NoError(t, err)
	return e
}

// connect opens a connection of the test's own and closes it when t ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// begin begins a transaction on a connection of its own; it is rolled
// back when t ends unless it ended before.
func (e *txEnv) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := connect(t, e.dsn).Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// claimTx begins a transaction and claims sc in it on replica a,
// requiring the claim to win.
func (e *txEnv) claimTx(t *testing.T, sc idem.Scope) (pgx.Tx, idem.Lease) {
	t.Helper()
	tx := e.begin(t)
	l, rec, err := e.a.ClaimTx(t.Context(), tx, sc, fp)
	require.NoError(t, err)
	require.Nil(t, rec)
	require.NotNil(t, l)
	return tx, l
}

// pay inserts the business row of key in tx.
func pay(t *testing.T, tx pgx.Tx, key string) {
	t.Helper()
	_, err := tx.Exec(t.Context(), `INSERT INTO payments VALUES ($1, 100)`, key)
	require.NoError(t, err)
}

// payments counts the committed business rows of key.
func (e *txEnv) payments(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, e.look.QueryRow(t.Context(), `SELECT count(*) FROM payments WHERE key = $1`, key).Scan(&n))
	return n
}

// awaitLockWait returns once some backend of the database waits on a
// lock: a claim blocked by an open transaction.
func (e *txEnv) awaitLockWait(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := e.look.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, wakeBound, 5*time.Millisecond, "no claim waits on the open transaction")
}

var created = idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
	Body: []byte(`{"id":"pay_1"}`)}

type claimResult struct {
	l   idem.Lease
	rec *idem.Record
	err error
}

// claimAsync claims sc on s in a goroutine.
func claimAsync(t *testing.T, s *pgstore.Store, sc idem.Scope) <-chan claimResult {
	out := make(chan claimResult, 1)
	go func() {
		l, rec, err := s.Claim(t.Context(), sc, fp)
		out <- claimResult{l, rec, err}
	}()
	return out
}

func result(t *testing.T, c <-chan claimResult) claimResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(wakeBound):
		t.Fatalf("the claim did not return within %s", wakeBound)
		return claimResult{}
	}
}

func TestInTxCommitsRowAndRecordTogether(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	resp, replayed, err := e.a.InTx(t.Context(), sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		pay(t, tx, "k")
		var lockTimeout string
		require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
		assert.Equal(t, "0", lockTimeout, "the claim's bound leaked into the caller's statements")
		return created, nil
	})
	require.NoError(t, err)
	assert.False(t, replayed)
	assert.Equal(t, created, resp)
	assert.Equal(t, 1, e.payments(t, "k"))
	rec, err := e.b.Get(t.Context(), sc)
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, rec.State)
	assert.Equal(t, created.Body, rec.Response.Body)

	runs := 0
	resp, replayed, err = e.b.InTx(t.Context(), sc, fp, func(context.Context, pgx.Tx) (idem.Response, error) {
		runs++
		return idem.Response{Status: 500}, nil
	})
	require.NoError(t, err)
	assert.True(t, replayed)
	assert.Equal(t, 0, runs)
	assert.Equal(t, created.Status, resp.Status)
	assert.Equal(t, created.Body, resp.Body)
}

func TestClaimTxInvisibleUntilCommit(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	tx, l := e.claimTx(t, sc)
	pay(t, tx, "k")
	require.NoError(t, l.Complete(t.Context(), created))
	assert.Equal(t, idem.StateCompleted, l.Record().State)

	// Neither the row nor the record is visible outside tx yet.
	assert.Equal(t, 0, e.payments(t, "k"))
	_, err := e.b.Get(t.Context(), sc)
	require.ErrorIs(t, err, idem.ErrNotFound)

	require.NoError(t, tx.Commit(t.Context()))
	assert.Equal(t, 1, e.payments(t, "k"))
	got, err := e.b.Get(t.Context(), sc)
	require.NoError(t, err)
	assert.Equal(t, idem.StateCompleted, got.State)
}

func TestInTxRollbackLeavesNoTrace(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	errDeclined := errors.New("declined")
	var runs atomic.Int64
	_, _, err := e.a.InTx(t.Context(), sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		runs.Add(1)
		pay(t, tx, "k")
		return idem.Response{}, errDeclined
	})
	require.ErrorIs(t, err, errDeclined)
	assert.Equal(t, 0, e.payments(t, "k"))
	_, err = e.b.Get(t.Context(), sc)
	require.ErrorIs(t, err, idem.ErrNotFound)

	// A panic rolls back too, and is raised again.
	assert.PanicsWithValue(t, "boom", func() {
		e.a.InTx(t.Context(), sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
			runs.Add(1)
			pay(t, tx, "k")
			panic("boom")
		})
	})
	assert.Equal(t, 0, e.payments(t, "k"))

	// The key is free: the next attempt runs and commits.
	_, replayed, err := e.b.InTx(t.Context(), sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		runs.Add(1)
		pay(t, tx, "k")
		return created, nil
	})
	require.NoError(t, err)
	assert.False(t, replayed)
	assert.Equal(t, int64(3), runs.Load())
	assert.Equal(t, 1, e.payments(t, "k"))
}

func TestClaimTxRollbackFreesKey(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	tx, l := e.claimTx(t, sc)
	pay(t, tx, "k")
	require.NoError(t, l.Complete(t.Context(), created))
	require.NoError(t, tx.Rollback(t.Context()))

	assert.Equal(t, 0, e.payments(t, "k"))
	l, rec, err := e.b.Claim(t.Context(), sc, fp)
	require.NoError(t, err)
	require.Nil(t, rec)
	require.NotNil(t, l)
}

func TestClaimTxDuplicateWaitsForCommit(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	tx, l := e.claimTx(t, sc)
	pay(t, tx, "k")

	// Wait sees no claim while tx is open, and leaves the wait to the
	// claim.
	woke := make(chan error, 1)
	go func() { woke <- e.b.Wait(t.Context(), sc) }()
	within(t, woke, wakeBound)

	dup := claimAsync(t, e.b, sc)
	e.awaitLockWait(t)
	select {
	case r := <-dup:
		t.Fatalf("the duplicate claim returned (%v, %v, %v) while the first transaction was open", r.l, r.rec, r.err)
	default:
	}
	require.NoError(t, l.Complete(t.Context(), created))
	require.NoError(t, tx.Commit(t.Context()))

	r := result(t, dup)
	require.NoError(t, r.err)
	require.Nil(t, r.l)
	require.NotNil(t, r.rec)
	assert.Equal(t, created.Body, r.rec.Response.Body)
	assert.Equal(t, 1, e.payments(t, "k"))
}

func TestClaimTxDuplicateWinsAfterRollback(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	tx, _ := e.claimTx(t, sc)
	pay(t, tx, "k")

	// The duplicate claims in a transaction of its own.
	tx2 := e.begin(t)
	dup := make(chan claimResult, 1)
	go func() {
		l, rec, err := e.b.ClaimTx(t.Context(), tx2, sc, fp)
		dup <- claimResult{l, rec, err}
	}()
	e.awaitLockWait(t)
	require.NoError(t, tx.Rollback(t.Context()))

	r := result(t, dup)
	require.NoError(t, r.err)
	require.NotNil(t, r.l, "the key of a rolled-back claim is free")
	pay(t, tx2, "k")
	require.NoError(t, r.l.Complete(t.Context(), created))
	require.NoError(t, tx2.Commit(t.Context()))
	assert.Equal(t, 1, e.payments(t, "k"))
}

func TestClaimTxDuplicateBoundedWait(t *testing.T) {
	e := newTxEnv(t, func(o *pgstore.Options) { o.ClaimWait = 50 * time.Millisecond })
	sc := scope("k")
	e.claimTx(t, sc)

	r := result(t, claimAsync(t, e.b, sc))
	require.ErrorIs(t, r.err, idem.ErrInProgress)
	var ke *idem.KeyError
	require.ErrorAs(t, r.err, &ke)
	assert.Equal(t, idem.StateInProgress, ke.State)
	assert.Equal(t, time.Second, ke.RetryAfter)

	// In a transaction, the refusal leaves it usable and its own
	// lock_timeout as it was.
	tx2 := e.begin(t)
	_, err := tx2.Exec(t.Context(), "SET LOCAL lock_timeout = '7s'")
	require.NoError(t, err)
	_, _, err = e.b.ClaimTx(t.Context(), tx2, sc, fp)
	require.ErrorIs(t, err, idem.ErrInProgress)
	var lockTimeout string
	require.NoError(t, tx2.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&lockTimeout))
	assert.Equal(t, "7s", lockTimeout)
	pay(t, tx2, "other")
	require.NoError(t, tx2.Commit(t.Context()))
	assert.Equal(t, 1, e.payments(t, "other"))
}

func TestClaimTxFingerprintMismatch(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	_, _, err := e.a.InTx(t.Context(), sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		pay(t, tx, "k")
		return created, nil
	})
	require.NoError(t, err)

	tx := e.begin(t)
	l, rec, err := e.b.ClaimTx(t.Context(), tx, sc, idem.Fingerprint{2})
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	var ke *idem.KeyError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, idem.StateCompleted, ke.State)
	assert.Nil(t, l)
	assert.Nil(t, rec)
	pay(t, tx, "other")
	require.NoError(t, tx.Commit(t.Context()), "a refusal left the transaction unusable")

	ran := false
	_, _, err = e.b.InTx(t.Context(), sc, idem.Fingerprint{2}, func(context.Context, pgx.Tx) (idem.Response, error) {
		ran = true
		return created, nil
	})
	require.ErrorIs(t, err, idem.ErrFingerprintMismatch)
	assert.False(t, ran)
}

func TestClaimTxReplayKeepsTxUsable(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	_, _, err := e.a.InTx(t.Context(), sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		pay(t, tx, "k")
		return created, nil
	})
	require.NoError(t, err)

	tx := e.begin(t)
	l, rec, err := e.b.ClaimTx(t.Context(), tx, sc, fp)
	require.NoError(t, err)
	assert.Nil(t, l)
	require.NotNil(t, rec)
	assert.Equal(t, created.Status, rec.Response.Status)
	assert.Equal(t, created.Body, rec.Response.Body)
	pay(t, tx, "audit")
	require.NoError(t, tx.Commit(t.Context()))
	assert.Equal(t, 1, e.payments(t, "audit"))
}

func TestClaimTxReleaseKeepsOtherWrites(t *testing.T) {
	e := newTxEnv(t, nil)
	sc := scope("k")
	tx, l := e.claimTx(t, sc)
	pay(t, tx, "audit")
	require.NoError(t, l.Release(t.Context()))
	require.NoError(t, tx.Commit(t.Context()))

	assert.Equal(t, 1, e.payments(t, "audit"))
	_, err := e.b.Get(t.Context(), sc)
	require.ErrorIs(t, err, idem.ErrNotFound)
}

// The end of a lease in a transaction is announced when the transaction
// commits, not before: notifications arrive in commit order, so one sent
// by another transaction while tx is open arrives first. Ends are
// announced only for records waited on, and a claim in a transaction is
// invisible to Wait; so the record here is one a waiter marked and that
// expired, which the claim in tx replaces, keeping the mark. The waiter,
// still asleep, is woken by the commit.
func TestClaimTxNotifiesAtCommit(t *testing.T) {
	clock := idemtest.NewClock()
	e := newTxEnv(t, func(o *pgstore.Options) { o.Now, o.Lease, o.TTL = clock.Now, time.Minute, time.Hour })
	listen := connect(t, e.dsn)
	_, err := listen.Exec(t.Context(), "LISTEN idem_keys")
	require.NoError(t, err)
	_, _, err = e.a.Claim(t.Context(), scope("k"), fp)
	require.NoError(t, err)
	woke := waitOn(t, e.b, scope("k"))
	clock.Advance(2 * time.Hour)

	tx, l := e.claimTx(t, scope("k"))
	require.NoError(t, l.Complete(t.Context(), created))
	_, err = e.look.Exec(t.Context(), "SELECT pg_notify('idem_keys', 'before-commit')")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(t.Context()))
	within(t, woke, wakeBound)

	ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
	defer cancel()
	var got []string
	for len(got) < 2 {
		n, err := listen.WaitForNotification(ctx)
		require.NoError(t, err)
		got = append(got, n.Payload)
	}
	assert.Equal(t, "before-commit", got[0])
	assert.NotEqual(t, "before-commit", got[1])
}

// The bound on a claim's wait lasts for the claim's statement only, also
// in the simple protocol that poolers such as PgBouncer need: on a pool of
// one connection, what runs after a claim that timed out, and after the
// claim of InTx, runs with the server's own lock_timeout.
func TestClaimWaitLeavesSessionAlone(t *testing.T) {
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run("mode="+mode, func(t *testing.T) {
			e := newTxEnv(t, nil)
			var serverDefault string
			require.NoError(t, e.look.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&serverDefault))
			s := open(t, e.dsn+"&pool_max_conns=1&default_query_exec_mode="+mode, &pgstore.Options{ClaimWait: 50 * time.Millisecond})
			e.claimTx(t, scope("held"))

			_, _, err := s.Claim(t.Context(), scope("held"), fp)
			require.ErrorIs(t, err, idem.ErrInProgress)
			_, _, err = s.InTx(t.Context(), scope("k"), fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
				var lockTimeout string
				require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
				assert.Equal(t, serverDefault, lockTimeout)
				pay(t, tx, "k")
				return created, nil
			})
			require.NoError(t, err)
			assert.Equal(t, 1, e.payments(t, "k"))
			_, rec, err := s.Claim(t.Context(), scope("k"), fp)
			require.NoError(t, err)
			require.NotNil(t, rec)
			assert.Equal(t, created.Header, rec.Response.Header)
			assert.Equal(t, created.Body, rec.Response.Body)
		})
	}
}

// At repeatable read, a key completed after the transaction's snapshot
// is a serialization failure the caller can recognise, not a replay it
// cannot see nor a second run.
func TestClaimTxRepeatableRead(t *testing.T) {
	e := newTxEnv(t, nil)
	tx, err := connect(t, e.dsn).BeginTx(t.Context(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	require.Equal(t, 0, countIn(t, tx)) // takes the snapshot

	_, _, err = e.b.InTx(t.Context(), scope("k"), fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		pay(t, tx, "k")
		return created, nil
	})
	require.NoError(t, err)

	l, rec, err := e.a.ClaimTx(t.Context(), tx, scope("k"), fp)
	assert.Nil(t, l)
	assert.Nil(t, rec)
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "40001", pe.Code)
}

// countIn counts the payments tx sees.
func countIn(t *testing.T, tx pgx.Tx) int {
	t.Helper()
	var n int
	require.NoError(t, tx.QueryRow(t.Context(), `SELECT count(*) FROM payments`).Scan(&n))
	return n
}

// A transaction that took over an expired record holds its row; a sweep
// leaves it alone instead of waiting for the transaction.
func TestClaimTxSweepSkipsHeldRow(t *testing.T) {
	clock := idemtest.NewClock()
	e := newTxEnv(t, func(o *pgstore.Options) { o.Now = clock.Now; o.TTL = time.Hour })
	var ttl time.Duration
	for _, k := range []string{"k", "other"} {
		l, _, err := e.a.Claim(t.Context(), scope(k), fp)
		require.NoError(t, err)
		require.NoError(t, l.Complete(t.Context(), created))
		ttl = l.Record().ExpiresAt.Sub(l.Record().CreatedAt)
	}
	clock.Advance(ttl)

	tx := e.begin(t)
	l, _, err := e.a.ClaimTx(t.Context(), tx, scope("k"), fp)
	require.NoError(t, err, "the expired record is taken over")
	ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
	defer cancel()
	res, err := e.b.Sweep(ctx)
	require.NoError(t, err, "the sweep waited for the transaction")
	assert.Equal(t, 1, res.Records)

	require.NoError(t, l.Complete(t.Context(), created))
	require.NoError(t, tx.Commit(t.Context()))
	_, err = e.b.Get(t.Context(), scope("k"))
	require.NoError(t, err)
	_, err = e.b.Get(t.Context(), scope("other"))
	require.ErrorIs(t, err, idem.ErrNotFound)
}

// A claim in a transaction that meets a live record, and so replays it or
// is refused, leaves no lock on it behind: while that transaction stays
// open, others claim the key and its holder completes it as usual.
func TestClaimTxRefusalHoldsNoLock(t *testing.T) {
	e := newTxEnv(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), wakeBound)
	defer cancel()
	_, _, err := e.a.InTx(ctx, scope("done"), fp, func(context.Context, pgx.Tx) (idem.Response, error) {
		return created, nil
	})
	require.NoError(t, err)
	held, _, err := e.a.Claim(ctx, scope("held"), fp)
	require.NoError(t, err)

	tx := e.begin(t)
	_, rec, err := e.b.ClaimTx(ctx, tx, scope("done"), fp)
	require.NoError(t, err)
	require.NotNil(t, rec)
	_, _, err = e.b.ClaimTx(ctx, tx, scope("held"), fp)
	require.ErrorIs(t, err, idem.ErrInProgress)

	// tx is still open.
	_, rec, err = e.a.Claim(ctx, scope("done"), fp)
	require.NoError(t, err, "a claim waited for a transaction that only replayed the key")
	require.NotNil(t, rec)
	require.NoError(t, held.Complete(ctx, created), "the holder waited for a transaction that was refused the key")
	_, rec, err = e.a.Claim(ctx, scope("held"), fp)
	require.NoError(t, err)
	require.NotNil(t, rec)
}
