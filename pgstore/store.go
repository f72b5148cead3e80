package pgstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkv/idem"
)

// Store is a idem.Operator on a PostgreSQL table that many replicas
// share. Open returns one; it is safe for concurrent use. Records it
// returns are copies the caller owns.
type Store struct {
	opts        Options
	sql         *schema
	lockTimeout string // Options.ClaimWait as a lock_timeout setting
	pool        *pgxpool.Pool
	db          pooled // statements on pool
	listener    *listener

	tally     idem.Tally
	reclaimed atomic.Int64 // bytes of the records swept since Open
	met       atomic.Int32 // see insertFirst

	closed    atomic.Bool
	closing   chan struct{} // closed by Close, to wake waiters and stop the loop
	loopDone  chan struct{} // closed when the background loop has stopped
	closeOnce sync.Once
	closeErr  error
}

var (
	_ idem.Operator = (*Store)(nil)
	_ idem.Sizer    = (*Store)(nil)
)

// querier runs statements: the pool, or one transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Open connects to the database dsn names, brings its schema up to date
// (or checks it, as Options.Migrate says) and returns the store. It keeps
// a pool of connections and one more connection that listens for the
// notifications that wake Wait. Errors never repeat the DSN.
func Open(ctx context.Context, dsn string, opts *Options) (*Store, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: parse DSN: %w", scrub(err))
	}
	if unverifiedRemote(cfg.ConnConfig.Config) {
		o.Logger.Warn("pgstore: the DSN reaches a remote server without sslmode=verify-full: the connection may be plaintext or " +
			"to an impostor, and stored answers and credentials cross it; set sslmode=verify-full and sslrootcert")
	}
	cfg.PrepareConn = usable
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "idem-pgstore"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: open pool: %w", scrub(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: connect: %w", scrub(err))
	}
	if err := checkDurability(ctx, pooled{pool}, o.Logger, o.RequireSynchronousStandby); err != nil {
		pool.Close()
		return nil, err
	}
	sc, err := findSchema(ctx, pooled{pool}, o.Schema)
	if err != nil {
		pool.Close()
		return nil, err
	}
	applied, err := migrate(ctx, pool, sc, o.Migrate)
	if err != nil {
		pool.Close()
		return nil, scrub(err)
	}
	if len(applied) > 0 {
		o.Logger.Info("pgstore: applied schema migrations", "versions", applied)
	}
	s := &Store{opts: o, sql: sc, pool: pool, db: pooled{pool}, closing: make(chan struct{}),
		lockTimeout: strconv.FormatInt(max(1, o.ClaimWait.Milliseconds()), 10) + "ms"}
	lcfg := cfg.ConnConfig.Copy()
	lcfg.RuntimeParams["application_name"] = listenerAppName
	s.listener, err = startListener(ctx, lcfg, o.Logger)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if off, err := s.clockOffset(ctx); err == nil && (off > o.ClockSkew/2 || off < -o.ClockSkew/2) {
		o.Logger.Warn("pgstore: this replica's clock differs from the database server's by more than half of ClockSkew: "+
			"other replicas may end its leases or expire its records early, or it theirs",
			"server_ahead_by", off, "clock_skew", o.ClockSkew)
	}
	s.loopDone = make(chan struct{})
	go s.loop()
	return s, nil
}

// clockOffset is how far the database server's clock is ahead of
// Options.Now, taken halfway through the round trip. The server is one
// clock that every replica can compare itself with: replicas each within
// half of ClockSkew of it are within ClockSkew of each other.
func (s *Store) clockOffset(ctx context.Context) (time.Duration, error) {
	before := s.opts.Now()
	var server time.Time
	if err := s.db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&server); err != nil {
		return 0, err
	}
	after := s.opts.Now()
	return server.Sub(before.Add(after.Sub(before) / 2)), nil
}

// Close stops the background loop and the listener, wakes every waiter
// and closes the pool.
// Leases still held become unusable (ErrClosed); their records stay in
// progress for reconciliation. Later calls return the first one's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.closing)
		<-s.loopDone
		s.listener.stop()
		s.pool.Close()
	})
	return s.closeErr
}

// enter reports ErrClosed once Close has run.
func (s *Store) enter() error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	return nil
}

// fail wraps an error from the database. A call that fails because Close
// ran meanwhile reports ErrClosed.
func (s *Store) fail(op string, err error) error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("pgstore: %s: %w", op, scrub(err))
}

// scrub replaces errors that quote the connection string (pgx's parse and
// connect errors name the user, host and database) by their cause.
func scrub(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("invalid connection string")
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if inner := errors.Unwrap(ce); inner != nil {
			return fmt.Errorf("cannot connect: %w", inner)
		}
		return errors.New("cannot connect")
	}
	return err
}

// validate checks sc as idem.Scope.Validate does, and that its parts
// can be stored as PostgreSQL text: valid UTF-8 without NUL bytes.
func validate(sc idem.Scope) error {
	if err := sc.Validate(); err != nil {
		return err
	}
	for _, part := range []string{sc.Tenant, sc.Endpoint, sc.Key} {
		if !utf8.ValidString(part) || strings.IndexByte(part, 0) >= 0 {
			return fmt.Errorf("%w: pgstore keeps scopes as text: valid UTF-8 without NUL bytes", idem.ErrInvalidScope)
		}
	}
	return nil
}

// now reads the clock at the database's precision, in UTC, so that a time
// written and read back is equal to the one the store computed.
func (s *Store) now() time.Time { return s.opts.Now().Truncate(time.Microsecond).UTC() }

// leaseEnd is when a lease granted at now ends for every replica: one
// Options.Lease later, plus Options.ClockSkew, so that no replica whose
// clock runs ahead within that bound sees it end before Lease has passed
// for the holder.
func (s *Store) leaseEnd(now time.Time) time.Time {
	return now.Add(s.opts.Lease + s.opts.ClockSkew)
}

// expiry is when a record of endpoint claimed at now expires: its TTL
// later, plus Options.ClockSkew, so that no replica drops it before the
// TTL has passed for the replica that claimed it.
func (s *Store) expiry(now time.Time, endpoint string) time.Time {
	ttl, ok := s.opts.EndpointTTL[endpoint]
	if !ok {
		ttl = s.opts.TTL
	}
	return now.Add(ttl + s.opts.ClockSkew)
}

// note counts e and logs it when Options.Events is set. start is when the
// lease began, or zero when there is no latency to report.
func (s *Store) note(e idem.Event, rec *idem.Record, start time.Time) {
	s.tally.Add(e)
	if s.opts.Events == nil {
		return
	}
	latency := time.Duration(-1)
	if !start.IsZero() {
		latency = s.opts.Now().Sub(start)
	}
	idem.LogEvent(s.opts.Events, e, rec.Scope, rec, latency)
}

// notifyChannel is the channel that ends of a lease are announced on; the
// payload is scopeTag of the record's scope.
const notifyChannel = "idem_keys"

// scopeTag is a short digest of s that names it in notifications. The
// parts are length-prefixed so that distinct scopes get distinct tags.
func scopeTag(s idem.Scope) string {
	h := sha256.New()
	for _, part := range []string{s.Tenant, s.Endpoint, s.Key} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(part))))
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// newToken returns a fresh lease token.
func newToken() []byte {
	b := make([]byte, 16)
	rand.Read(b)
	return b
}

// columns are the columns scanRecord reads, in its order.
const columns = `tenant, endpoint, idem_key, fingerprint, state, response_status,
	response_headers, response_body, body_len, body_digest, body_omitted,
	lease_token, lease_until, attempts, created_at, updated_at, expires_at`

// listColumns are columns with bodies over 64 KiB left out, for listings
// that may return many records.
const listColumns = `tenant, endpoint, idem_key, fingerprint, state, response_status,
	response_headers, CASE WHEN body_len <= 65536 THEN response_body END, body_len, body_digest, body_omitted,
	lease_token, lease_until, attempts, created_at, updated_at, expires_at`

// row is one scanned record and its lease token.
type row struct {
	rec   idem.Record
	token []byte
}

// scanRecord reads the columns of columns from r; extra, when given, are
// scanned after them.
func scanRecord(r pgx.Row, extra ...any) (*row, error) {
	var (
		out                      row
		fp, digest, hdr, body    []byte
		status                   *int32
		state                    int16
		attempts                 int32
		leaseUntil, created, upd time.Time
		expires                  time.Time
	)
	dest := []any{&out.rec.Scope.Tenant, &out.rec.Scope.Endpoint, &out.rec.Scope.Key, &fp, &state, &status,
		&hdr, &body, &out.rec.BodyLen, &digest, &out.rec.BodyOmitted,
		&out.token, &leaseUntil, &attempts, &created, &upd, &expires}
	if err := r.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	if len(fp) != len(out.rec.Fingerprint) {
		return nil, fmt.Errorf("%w: fingerprint of %d bytes", idem.ErrCorrupt, len(fp))
	}
	copy(out.rec.Fingerprint[:], fp)
	copy(out.rec.BodyDigest[:], digest)
	out.rec.State = idem.State(state)
	if status != nil {
		out.rec.Response.Status = int(*status)
	}
	if len(hdr) > 0 {
		if err := json.Unmarshal(hdr, &out.rec.Response.Header); err != nil {
			return nil, fmt.Errorf("%w: response headers: %v", idem.ErrCorrupt, err)
		}
		if len(out.rec.Response.Header) == 0 {
			out.rec.Response.Header = nil
		}
	}
	if len(body) > 0 {
		out.rec.Response.Body = body
	}
	out.rec.Attempts = uint32(attempts)
	out.rec.LeaseUntil, out.rec.CreatedAt = leaseUntil.UTC(), created.UTC()
	out.rec.UpdatedAt, out.rec.ExpiresAt = upd.UTC(), expires.UTC()
	return &out, nil
}

// cloneRecord copies rec with its own header and body.
func cloneRecord(rec idem.Record) idem.Record {
	if len(rec.Response.Header) > 0 {
		rec.Response.Header = rec.Response.Header.Clone()
	} else {
		rec.Response.Header = nil
	}
	if len(rec.Response.Body) > 0 {
		rec.Response.Body = bytes.Clone(rec.Response.Body)
	} else {
		rec.Response.Body = nil
	}
	return rec
}

// encodeHeader is what response_headers holds for h: NULL for none. The
// JSON goes as a string: the simple protocol (poolers such as PgBouncer)
// sends a []byte as a bytea literal, which is not JSON.
func encodeHeader(h http.Header) (any, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

// getSQL reads the live record of a scope. A claim that reads first (see
// insertFirst) answers a replay or a refusal with this one plain read,
// which writes and locks nothing and costs the server less than a
// statement that could also insert.
const getSQL = `SELECT ` + columns + ` FROM {keys}
WHERE tenant = $1 AND endpoint = $2 AND idem_key = $3 AND expires_at > $4`

// insertSQL claims a key that getSQL found no live record for: it inserts
// a fresh claim, or replaces a record that has expired, on the primary
// key, so of many callers at once exactly one gets a row back. A record
// committed since the read, which the insert meets, yields no row; the
// caller reads again. Before it inserts, the statement bounds its own
// lock waits by $9 (lock_timeout for the rest of the transaction): the
// wait for another transaction that holds the same key and has not ended
// yet. The parameters are cast, since an INSERT from a SELECT does not
// give them its columns' types.
const insertSQL = `
INSERT INTO {keys} AS k (tenant, endpoint, idem_key, fingerprint, state,
	lease_token, lease_until, attempts, created_at, updated_at, expires_at)
SELECT $1, $2, $3, $4::bytea, 1, $5::bytea, $6::timestamptz, 1, $7::timestamptz, $7, $8::timestamptz
WHERE set_config('lock_timeout', $9, true) IS NOT NULL
ON CONFLICT (tenant, endpoint, idem_key) DO UPDATE SET
	fingerprint = EXCLUDED.fingerprint, state = 1,
	response_status = NULL, response_headers = NULL, response_body = NULL,
	body_len = 0, body_digest = NULL, body_omitted = false,
	lease_token = EXCLUDED.lease_token, lease_until = EXCLUDED.lease_until, attempts = 1,
	created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at
WHERE k.expires_at <= $7
RETURNING true`

// tryInsertSQL is a claim's insert when it goes first: it inserts a fresh
// claim and leaves any record in the way alone, without locking it, so a
// retry that meets a live record writes nothing. The lock wait it bounds
// is the same as insertSQL's.
const tryInsertSQL = `
INSERT INTO {keys} (tenant, endpoint, idem_key, fingerprint, state,
	lease_token, lease_until, attempts, created_at, updated_at, expires_at)
SELECT $1, $2, $3, $4::bytea, 1, $5::bytea, $6::timestamptz, 1, $7::timestamptz, $7, $8::timestamptz
WHERE set_config('lock_timeout', $9, true) IS NOT NULL
ON CONFLICT (tenant, endpoint, idem_key) DO NOTHING
RETURNING true`

// metBound bounds Store.met, so that the order follows a change of
// workload within a few dozen claims.
const metBound = 32

// insertFirst reports whether a claim on the pool tries its insert before
// reading. Each order spends one statement in vain in the case it does
// not expect: reading first, on a new key; inserting first, on a key that
// has a record. Store.met rises for each claim that met a record and
// falls for each that did not, so claims insert first while new keys are
// at least half of them, as they are when few requests are retries.
func (s *Store) insertFirst() bool { return s.met.Load() <= 0 }

// noteMet moves Store.met towards what a claim found.
func (s *Store) noteMet(found bool) {
	d := int32(-1)
	if found {
		d = 1
	}
	for {
		v := s.met.Load()
		n := min(max(v+d, -metBound), metBound)
		if n == v || s.met.CompareAndSwap(v, n) {
			return
		}
	}
}

// claimRetries bounds how often Claim goes round when its insert
// returned nothing: each time, a record committed meanwhile was in the
// way, and was released or swept before the next try could read it.
const claimRetries = 8

// lockTimeoutSQL sets lock_timeout for the rest of the transaction: after
// a claim in the caller's transaction, to the caller's own.
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// sqlLockNotAvailable is the SQLSTATE of a lock wait past lock_timeout.
const sqlLockNotAvailable = "55P03"

// Claim tries to take the key in s, as idem.Store.Claim says. While
// a transaction that claimed the same key (ClaimTx, InTx) is still open,
// Claim waits for it to end, at most Options.ClaimWait: then it gets the
// replay if that transaction completed the key, the key if it rolled
// back, and ErrInProgress if it is still open.
func (s *Store) Claim(ctx context.Context, sc idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	l, rec, err := s.claim(ctx, nil, sc, fp)
	if l == nil {
		return nil, rec, err // not a nil *lease in a non-nil interface
	}
	return l, nil, nil
}

// claim claims sc in tx, the caller's transaction, or on the pool when tx
// is nil. The lease it grants runs on the same.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, sc idem.Scope, fp idem.Fingerprint) (*lease, *idem.Record, error) {
	var q querier = s.db
	if tx != nil {
		q = tx
	}
	if err := validate(sc); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if err := s.enter(); err != nil {
		return nil, nil, err
	}
	read := tx != nil || !s.insertFirst()
	for range claimRetries {
		now := s.now()
		if read {
			r, err := scanRecord(q.QueryRow(ctx, s.sql.get, sc.Tenant, sc.Endpoint, sc.Key, now))
			if err == nil {
				if tx == nil {
					s.noteMet(true)
				}
				rec, err := s.answer(&r.rec, fp, now)
				return nil, rec, err
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return nil, nil, s.fail("claim", err)
			}
		}
		l := &lease{s: s, q: q, scope: sc, token: newToken(), start: now, rec: idem.Record{
			Scope: sc, Fingerprint: fp, State: idem.StateInProgress, Attempts: 1,
			LeaseUntil: s.leaseEnd(now), CreatedAt: now, UpdatedAt: now, ExpiresAt: s.expiry(now, sc.Endpoint)}}
		args := []any{sc.Tenant, sc.Endpoint, sc.Key, fp[:], l.token, l.rec.LeaseUntil, now, l.rec.ExpiresAt, s.lockTimeout}
		var err error
		switch {
		case tx != nil:
			err = s.insertClaimTx(ctx, tx, args)
		case read:
			err = s.db.QueryRow(ctx, s.sql.insert, args...).Scan(new(bool))
		default:
			err = s.db.QueryRow(ctx, s.sql.tryInsert, args...).Scan(new(bool))
		}
		if err == nil {
			if tx == nil {
				s.noteMet(false)
			}
			s.note(idem.EventClaimed, &l.rec, time.Time{})
			return l, nil, nil
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == sqlLockNotAvailable {
			// Another transaction holds the key and did not end in time.
			rec := &idem.Record{Scope: sc, State: idem.StateInProgress}
			s.note(idem.EventConflict, rec, time.Time{})
			return nil, nil, &idem.KeyError{Err: idem.ErrInProgress, State: idem.StateInProgress,
				RetryAfter: time.Second, Tenant: sc.Tenant, Endpoint: sc.Endpoint}
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, nil, s.fail("claim", err)
		}
		// A record was in the way: read it on the next round.
		read = true
	}
	return nil, nil, fmt.Errorf("pgstore: claim: the record kept changing under %d attempts", claimRetries)
}

// insertClaimTx runs insertSQL with args in tx under a savepoint, its
// lock waits bounded by Options.ClaimWait. The savepoint keeps tx usable
// when the statement fails, and the caller's own lock_timeout is restored
// afterwards. On the pool the statement is its own transaction, so the
// setting ends with it.
func (s *Store) insertClaimTx(ctx context.Context, tx pgx.Tx, args []any) error {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT idem_claim")
	b.Queue("SELECT current_setting('lock_timeout')")
	b.Queue(s.sql.insert, args...)
	br := tx.SendBatch(ctx, b)
	var prev string
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&prev)
	}
	if err == nil {
		err = br.QueryRow().Scan(new(bool))
	}
	if cerr := br.Close(); cerr != nil && (err == nil || errors.Is(err, pgx.ErrNoRows)) {
		err = cerr
	}
	if err != nil {
		// Rolling back to the savepoint undoes the setting, and releases
		// the lock that ON CONFLICT takes on a live record it leaves
		// alone: kept until tx ends, it would hold up that record's
		// holder and every other claim of the key. Without arguments Exec
		// uses the simple protocol, which an aborted transaction accepts:
		// it prepares nothing.
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT idem_claim; RELEASE SAVEPOINT idem_claim"); rerr != nil {
			return rerr // tx is unusable; what it refused no longer matters
		}
		return err
	}
	b = &pgx.Batch{}
	b.Queue(lockTimeoutSQL, prev)
	b.Queue("RELEASE SAVEPOINT idem_claim")
	return tx.SendBatch(ctx, b).Close()
}

// answer answers a claim of the live record rec as idem.Decide says.
func (s *Store) answer(rec *idem.Record, fp idem.Fingerprint, now time.Time) (*idem.Record, error) {
	event, err := idem.Decide(rec, fp, now, s.opts.reconcileEvery())
	s.note(event, rec, time.Time{})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// Get returns the live record for s, as idem.Store.Get says.
func (s *Store) Get(ctx context.Context, sc idem.Scope) (*idem.Record, error) {
	if err := validate(sc); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	r, err := scanRecord(s.db.QueryRow(ctx, s.sql.get, sc.Tenant, sc.Endpoint, sc.Key, s.now()))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, idem.ErrNotFound
	}
	if err != nil {
		return nil, s.fail("get", err)
	}
	return &r.rec, nil
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	if err := s.pool.Ping(ctx); err != nil {
		return s.fail("ping", err)
	}
	return nil
}

// unverifiedRemote reports whether cfg may reach a server over a network
// without a verified certificate: pgx's default sslmode=prefer falls back
// to plaintext and, like require and verify-ca, checks no host name. A
// Unix socket or a loopback address never leaves the machine.
func unverifiedRemote(cfg pgconn.Config) bool {
	tries := append([]*pgconn.FallbackConfig{{Host: cfg.Host, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	for _, f := range tries {
		ip := net.ParseIP(f.Host)
		local := strings.HasPrefix(f.Host, "/") || f.Host == "localhost" || (ip != nil && ip.IsLoopback())
		if !local && (f.TLSConfig == nil || f.TLSConfig.InsecureSkipVerify) {
			return true
		}
	}
	return false
}
