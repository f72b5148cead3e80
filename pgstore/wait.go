package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkv/idem"
)

// listenerAppName is the application_name of the listening connection,
// so operators can tell it apart in pg_stat_activity.
const listenerAppName = "idem-pgstore-listener"

const (
	// pollInterval is how often a waiter re-reads its record while the
	// listener is disconnected and notifications may be missed.
	pollInterval = 500 * time.Millisecond
	// idleCheck is how long the listener waits for a notification before
	// it checks that its connection still answers.
	idleCheck = 30 * time.Second
	// reconnectDelay is the pause between attempts to reconnect.
	reconnectDelay = 250 * time.Millisecond
)

// listener owns the one connection of a Store that LISTENs on
// notifyChannel, and hands each notification to the waiters of its scope.
// When the connection is lost it reconnects; meanwhile waiters fall back
// to re-reading their records every pollInterval.
type listener struct {
	cfg    *pgx.ConnConfig
	logger *slog.Logger
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns

	// mu guards the fields below.
	mu        sync.Mutex
	connected bool
	pid       uint32 // the listening backend's process id, while connected
	waiters   map[string]map[*waiter]struct{}
}

// waiter is one Wait in progress. wake is closed once, by the listener,
// when a notification for the scope arrives (notified) or when the
// listener connects or disconnects, so the waiter looks again.
type waiter struct {
	tag      string
	wake     chan struct{}
	notified bool // guarded by listener.mu
}

// startListener connects and starts listening; the first connection must
// succeed, so that Open reports a database that refuses it.
func startListener(ctx context.Context, cfg *pgx.ConnConfig, logger *slog.Logger) (*listener, error) {
	conn, err := listen(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: listen: %w", scrub(err))
	}
	lctx, cancel := context.WithCancel(context.Background())
	l := &listener{cfg: cfg, logger: logger, cancel: cancel, done: make(chan struct{}),
		connected: true, pid: conn.PgConn().PID(), waiters: map[string]map[*waiter]struct{}{}}
	go l.run(lctx, conn)
	return l, nil
}

func listen(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{notifyChannel}.Sanitize()); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// run receives notifications on conn until ctx ends, reconnecting as
// needed.
func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	defer close(l.done)
	for {
		err := l.receive(ctx, conn)
		conn.Close(context.Background())
		l.setConnected(false, 0)
		if ctx.Err() != nil {
			return
		}
		l.logger.Warn("pgstore: listener connection lost; waiters re-read their records until it is back", "err", scrub(err))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(reconnectDelay):
			}
			if conn, err = listen(ctx, l.cfg); err == nil {
				break
			}
		}
		l.logger.Info("pgstore: listener reconnected")
		l.setConnected(true, conn.PgConn().PID())
	}
}

// receive dispatches notifications until the connection fails or ctx
// ends.
func (l *listener) receive(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, idleCheck)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			l.dispatch(n.Payload)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, idleCheck)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}

func (l *listener) dispatch(tag string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters[tag] {
		w.notified = true
		close(w.wake)
	}
	delete(l.waiters, tag)
}

// setConnected records the connection's state and wakes every waiter to
// look again: after a loss they start polling, after a reconnection they
// catch up on what they may have missed.
func (l *listener) setConnected(connected bool, pid uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.connected, l.pid = connected, pid
	for tag, ws := range l.waiters {
		for w := range ws {
			close(w.wake)
		}
		delete(l.waiters, tag)
	}
}

// register adds a waiter for tag and reports whether the listener is
// connected, so notifications will reach it.
func (l *listener) register(tag string) (*waiter, bool) {
	w := &waiter{tag: tag, wake: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiters[tag] == nil {
		l.waiters[tag] = map[*waiter]struct{}{}
	}
	l.waiters[tag][w] = struct{}{}
	return w, l.connected
}

// unregister removes w if it is still registered, and reports whether it
// was notified.
func (l *listener) unregister(w *waiter) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ws := l.waiters[w.tag]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(l.waiters, w.tag)
		}
	}
	return w.notified
}

func (l *listener) listenerPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

func (l *listener) stop() {
	l.cancel()
	<-l.done
}

// Wait blocks while s is in progress under a live lease, as
// idem.Store.Wait says. The end of a lease on any replica wakes it
// through LISTEN/NOTIFY; a lease that merely runs out does not, since
// nothing announces it. Each look at the record also marks it as waited
// on, a write, so that the end of its lease is announced. While the
// listener is reconnecting, Wait re-reads the record every half second
// instead. A claim in a transaction that has
// not committed (ClaimTx, InTx) is invisible to Wait, which returns at
// once; the next Claim waits for that transaction, up to
// Options.ClaimWait.
func (s *Store) Wait(ctx context.Context, sc idem.Scope) error {
	if err := validate(sc); err != nil {
		return err
	}
	tag := scopeTag(sc)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.enter(); err != nil {
			return err
		}
		// Register before marking and reading, so that an end of the
		// lease committed after the read is announced to this waiter
		// (see waitSQL).
		w, connected := s.listener.register(tag)
		held, err := s.mark(ctx, sc)
		if err != nil || !held {
			s.listener.unregister(w)
			return err
		}
		var (
			poll  <-chan time.Time
			timer *time.Timer
		)
		if !connected {
			timer = time.NewTimer(pollInterval)
			poll = timer.C
		}
		woken := false
		select {
		case <-w.wake:
			woken = s.listener.unregister(w)
		case <-poll:
			s.listener.unregister(w)
		case <-ctx.Done():
			s.listener.unregister(w)
			return ctx.Err()
		case <-s.closing:
			s.listener.unregister(w)
			return idem.ErrClosed
		}
		if timer != nil {
			timer.Stop()
		}
		if woken {
			return nil
		}
	}
}

// waitSQL marks the record of a waiter's scope as waited on and reports
// whether it is in progress under a live lease, in one statement. The
// ends of a lease (settleSQL, releaseSQL, takeOverSQL, reconcilePickSQL)
// notify only when their row says waiting, so the commit of a completion
// that nobody waits for takes no notification lock.
//
// No wake-up is lost. Wait registers with the listener, then runs this
// statement; it and an end of the lease both write the row, so PostgreSQL
// orders them by its row lock. If the end commits first, this statement
// sees the row as the end left it (READ COMMITTED re-checks its WHERE on
// the newest version after waiting for the lock) and reports the lease
// over, or held by a new one. If the mark commits first, the end's row
// carries waiting = true and the end notifies at its commit, after the
// mark, so after the registration: the listener hands it to this waiter.
// The mark is never cleared: an end that cleared it would no longer see,
// in the row it returns, whether it was set. A record once waited on
// costs a notification per end of a lease for the rest of its life. A
// claim that replaces an expired record keeps the mark, as any waiter
// still asleep on it waits for that claim's lease to end too.
const waitSQL = `UPDATE {keys} SET waiting = true
WHERE tenant = $1 AND endpoint = $2 AND idem_key = $3
	AND expires_at > $4 AND state = 1 AND lease_until > $4
RETURNING true`

// mark marks s as waited on and reports whether s is in progress under a
// live lease (waitSQL).
func (s *Store) mark(ctx context.Context, sc idem.Scope) (bool, error) {
	var held bool
	err := s.db.QueryRow(ctx, s.sql.wait, sc.Tenant, sc.Endpoint, sc.Key, s.now()).Scan(&held)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.fail("wait", err)
	}
	return held, nil
}
