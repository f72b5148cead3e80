package reliability_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pgstore"
)

// The replica campaign: the kill campaign's checks, with three idem proxy
// processes sharing one PostgreSQL database in place of one proxy on its
// own directory. Clients send every attempt of a request to a replica
// picked at random among those running, so a key is claimed on one
// replica, retried on another while the first still works, and replayed
// by a third. Each round a random replica is killed with SIGKILL at a
// random moment under load and started again on the same database; the
// others keep serving. Now and then a round restarts the PostgreSQL
// server instead, in immediate mode, which cuts every replica's
// connections at once: requests meanwhile get 503 store_unavailable, and
// the same replicas, never restarted, serve again once it is back.
//
// After every round each of the round's keys (and some older ones) is
// sent to every running replica, once no replica holds it any more:
//
//   - a key whose response any client received replays those bytes
//     exactly, from every replica;
//   - a key cut off by the kill or the outage answers 409 outcome_pending
//     from every replica, and goes on doing so;
//   - only a key whose claim never reached the database may run now;
//   - the journal shows no key executed twice.
//
// At the end the database is read with pgstore: every acknowledged answer
// is stored, and every key the upstream ran has a record, since the proxy
// only calls the upstream under a stored claim.

// replicaLease is short so that a killed replica's keys turn
// outcome_pending soon, which each round waits for; and long beside the
// few milliseconds a live replica takes to store an outcome, which must
// never find its key already answered outcome_pending by another replica.
const (
	replicaLease    = 2 * time.Second
	replicaCount    = 3
	pgRestartPeriod = 30 // rounds between two restarts of the server
)

// replicaSet is the running replicas of one PostgreSQL store. It is safe
// for concurrent use.
type replicaSet struct {
	args []string

	mu    sync.Mutex
	procs [replicaCount]*crashtest.Process // guarded by mu
	urls  [replicaCount]string             // guarded by mu; "" while the replica is down
}

// start starts replica i and waits until it listens.
func (s *replicaSet) start(t *testing.T, i int) {
	t.Helper()
	p, url := startProxy(t, s.args)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[i], s.urls[i] = p, url
}

// kill kills replica i with SIGKILL; clients stop picking it at once.
func (s *replicaSet) kill(i int) {
	s.mu.Lock()
	p := s.procs[i]
	s.urls[i] = ""
	s.mu.Unlock()
	p.Kill()
}

// pick returns the URL of a running replica chosen with rng.
func (s *replicaSet) pick(rng *rand.Rand) string {
	live := s.live()
	return live[rng.IntN(len(live))]
}

// live returns the URLs of the running replicas.
func (s *replicaSet) live() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, u := range s.urls {
		if u != "" {
			out = append(out, u)
		}
	}
	return out
}

// replicaCampaign is the kill campaign's bookkeeping plus what the
// outages add.
type replicaCampaign struct {
	*killCampaign
	outage      atomic.Bool  // a server restart is under way in this round
	unavailable atomic.Int64 // 503 store_unavailable answers during outages
	checks      atomic.Int64 // requests sent by the checks after rounds
}

// observe records a client's answer. A 503 store_unavailable is an answer
// of the contract only while the server is down or just back.
func (c *replicaCampaign) observe(k *keyRun, r reply) {
	if r.code() == idem.CodeStoreUnavailable && c.outage.Load() {
		c.unavailable.Add(1)
		return
	}
	c.killCampaign.observe(k, r)
}

// settled sends k to the replica at url until no replica holds the key:
// request_in_progress comes from a lease still running, the dead
// replica's until it ends or a live replica's until it stores the
// outcome; store_unavailable, during an outage round, from
// connections that the restart broke. The answer after those is final.
func (c *replicaCampaign) settled(t *testing.T, client *http.Client, url string, k *keyRun) reply {
	t.Helper()
	deadline := time.Now().Add(guard)
	for {
		r, err := do(context.Background(), client, "POST", url+chargePath, k.body, k.headers()...)
		c.checks.Add(1)
		require.NoError(t, err, "a running replica must answer")
		busy := r.code() == idem.CodeInProgress || r.code() == idem.CodeStoreUnavailable && c.outage.Load()
		if !busy {
			if r.status == http.StatusCreated {
				c.checkAnswer(k, r)
			}
			return r
		}
		require.True(t, time.Now().Before(deadline), "key %s/%s: still %d %s after %s", k.tenant, k.key, r.status, r.code(), guard)
		time.Sleep(20 * time.Millisecond) // paces the polling; the answer decides
	}
}

// checkEverywhere sends k to every running replica and checks each answer
// as the kill campaign checks the restarted proxy's.
func (c *replicaCampaign) checkEverywhere(t *testing.T, client *http.Client, set *replicaSet, k *keyRun) {
	t.Helper()
	for _, url := range set.live() {
		c.observeAfterKill(k, c.settled(t, client, url, k))
	}
}

func TestReplicaKillCampaign(t *testing.T) {
	began := time.Now()
	dsn := pgtest.DSN(t)
	restartable := pgtest.Restartable()
	if !restartable {
		t.Logf("%s names an external server: the campaign kills replicas but does not restart the server", pgtest.EnvDSN)
	}
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 4))
	up := startUpstream(t, 15*time.Millisecond)
	set := &replicaSet{args: pgProxyArgs(dsn, "127.0.0.1:0", up.url, "--lease", replicaLease.String())}
	for i := range replicaCount {
		set.start(t, i)
	}
	c := &replicaCampaign{killCampaign: &killCampaign{}}
	client := newClient()

	var inFlightKills, startupKills, restarts int
	for round := 1; inFlightKills < *pgKills; round++ {
		restart := restartable && (round == 2 || round%pgRestartPeriod == 0)
		keys := newRoundKeys(rng, "p", round)
		c.keys = append(c.keys, keys...)

		// Clients retry the round's keys, each attempt on a random
		// running replica, until the round ends.
		ctx, cancel := context.WithCancel(context.Background())
		wg := c.load(ctx, client, seed, round, keys, set.pick, c.observe)
		time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
		if restart {
			c.outage.Store(true)
			pgtest.Restart(t)
			restarts++
			// The same replicas must serve again under the same load:
			// wait for answers from the store again.
			c.mu.Lock()
			before := c.created + c.replays
			c.mu.Unlock()
			deadline := time.Now().Add(guard)
			for {
				c.mu.Lock()
				after := c.created + c.replays
				c.mu.Unlock()
				if after >= before+5 {
					break
				}
				require.True(t, time.Now().Before(deadline), "the replicas do not serve again after the server's restart")
				time.Sleep(10 * time.Millisecond)
			}
		} else {
			// The others serve alone for a moment, then the killed
			// replica comes back on the same database under load.
			i := rng.IntN(replicaCount)
			set.kill(i)
			inFlightKills++
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
			if rng.IntN(4) == 0 {
				p, err := crashtest.Start(idemBin, nil, set.args...)
				require.NoError(t, err)
				time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
				p.Kill()
				startupKills++
			}
			set.start(t, i)
			time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		}
		cancel()
		wg.Wait()
		client.CloseIdleConnections()

		check := keys
		for range 16 {
			if k := c.keys[rng.IntN(len(c.keys))]; k.round < round {
				check = append(check, k)
			}
		}
		for _, k := range check {
			c.checkEverywhere(t, client, set, k)
		}
		c.outage.Store(false)
		require.Zero(t, checkJournal(t, c.killCampaign, up), "no key may execute twice")
		require.Empty(t, c.violations, "round %d", round)
	}

	// Every key, through every replica, once more: answers stay put.
	for _, k := range c.keys {
		c.checkEverywhere(t, client, set, k)
	}
	require.Zero(t, checkJournal(t, c.killCampaign, up))
	require.Empty(t, c.violations)

	for i := range replicaCount {
		p := set.procs[i]
		require.NoError(t, p.Signal(syscall.SIGTERM))
		code, err := p.Wait(guard)
		require.NoError(t, err)
		require.Equal(t, 0, code, p.Stderr())
	}
	lost := checkFinalPGStore(t, c.killCampaign, up, dsn)

	c.mu.Lock()
	defer c.mu.Unlock()
	assert.Empty(t, c.violations)
	assert.Empty(t, c.unexpected, "answers outside the contract")
	assert.Zero(t, lost, "acknowledged results lost")
	if restarts > 0 {
		assert.Positive(t, c.unavailable.Load(), "no request met the server's outage")
	}
	var acked, cutOff int
	for _, k := range c.keys {
		if k.ack != nil && !k.interrupted {
			acked++
		}
		if k.interrupted {
			cutOff++
		}
	}
	t.Logf("replicas: %d on one PostgreSQL database; replica kills: %d (%d under load, %d more while starting); server restarts (immediate): %d",
		replicaCount, inFlightKills+startupKills, inFlightKills, startupKills, restarts)
	t.Logf("keys: %d; executions journalled: %d; replayed by every replica: %d; interrupted (409 from every replica ever since): %d",
		len(c.keys), up.executions(t), acked, cutOff)
	t.Logf("requests: %d under load (201 first: %d, 201 replayed: %d, 409 in progress: %d, 409 pending: %d, 503 during outages: %d), transport errors at kills: %d; %d by the checks",
		c.sent+int(c.unavailable.Load()), c.created, c.replays, c.inProgress, c.pending, c.unavailable.Load(), c.transportErrs, c.checks.Load())
	t.Logf("checks after rounds: completed but unseen by clients: %d; claim never stored, ran fresh: %d; 409 outcome_pending: %d",
		c.completedUnseen, c.freshAfterKill, c.pendingAfterKill)
	t.Logf("duplicates found: 0; acknowledged results lost: %d; took %s", lost, time.Since(began).Round(time.Second))
}

// checkFinalPGStore reads every key of the campaign from the database with
// pgstore and returns how many acknowledged results are not there. It
// also checks that every key the journal shows executed has a record: an
// execution without one ran without a stored claim.
func checkFinalPGStore(t *testing.T, c *killCampaign, up *upstreamProc, dsn string) (lost int) {
	t.Helper()
	ctx := context.Background()
	db, err := pgstore.Open(ctx, dsn, &pgstore.Options{Migrate: pgstore.MigrateRefuse, Logger: quietLogger()})
	require.NoError(t, err)
	defer db.Close()
	counts := map[string]int{}
	stored := map[string]bool{}
	for _, rec := range allRecords(t, db) {
		counts[rec.State.String()]++
		stored[crashtest.TenantKey(rec.Scope.Tenant, rec.Scope.Key)] = true
	}
	t.Logf("final store: records by state %v", counts)
	execs, err := crashtest.ReadJournal(up.journal)
	require.NoError(t, err)
	for _, e := range execs {
		assert.True(t, stored[crashtest.TenantKey(e.Tenant, e.Key)], "key %s/%s ran without a stored claim", e.Tenant, e.Key)
	}
	for _, k := range c.keys {
		rec, err := db.Get(ctx, idem.Scope{Tenant: k.tenant, Endpoint: chargeEndpoint, Key: k.key})
		switch {
		case k.interrupted || k.ack != nil:
			if !keptAsAnswered(t, k, rec, err) {
				lost++
			}
		default:
			// The final pass sent every key: each has an answer or is
			// interrupted.
			t.Errorf("key %s/%s: never answered", k.tenant, k.key)
		}
	}
	return lost
}
