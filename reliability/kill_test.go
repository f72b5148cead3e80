package reliability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/pebblestore"
)

// The kill campaign. A real idem proxy runs in front of the journalling
// upstream; clients retry a shared pool of keys at once, so that claims,
// upstream calls and completions of many keys overlap; the proxy is killed
// with SIGKILL at a random moment and restarted on the same data. After
// every kill:
//
//   - the store opens with the library and every record decodes;
//   - each key of the round is sent again through the restarted proxy: a
//     key whose response any client received replays those bytes exactly;
//     a key that was cut off answers 409 (request_in_progress while the
//     dead proxy's lease runs, outcome_pending after) and stays so; only a
//     key whose claim never reached the disk may run now;
//   - the journal shows no key executed twice. The proxy releases a key
//     only when it could not reach the upstream, which never happens here,
//     so the bound is exactly one.
//
// Some kills land while the proxy is still starting, before it listens, to
// check that a store interrupted while opening opens again.

const (
	chargePath     = "/v1/charges"
	chargeEndpoint = "POST " + chargePath
	killLease      = 2 * time.Second
	roundKeys      = 40
	roundClients   = 12
)

// keyRun is what the campaign knows about one key.
type keyRun struct {
	tenant, key, body string
	round             int

	mu          sync.Mutex
	ack         *reply // the first upstream response a client received
	interrupted bool   // answered 409 after a kill: its outcome was never stored
	ran         bool   // a fresh execution was seen after a kill
}

type killCampaign struct {
	mu         sync.Mutex
	keys       []*keyRun
	violations []string // guarded by mu
	unexpected []string // answers outside the contract, guarded by mu

	// Figures, guarded by mu.
	sent, created, replays, inProgress, pending, transportErrs int
	completedUnseen, freshAfterKill                            int
	inProgressAfterKill, pendingAfterKill                      int
}

func (c *killCampaign) violate(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

func (k *keyRun) headers() []string {
	return []string{"Idempotency-Key", k.key, crashtest.TenantHeader, k.tenant}
}

// checkAnswer checks that a 201 is the upstream's answer for this very
// tenant and key.
func (c *killCampaign) checkAnswer(k *keyRun, r reply) {
	var a crashtest.Answer
	if err := json.Unmarshal(r.body, &a); err != nil || a.Tenant != k.tenant || a.Key != k.key {
		c.violate("key %s/%s: a 201 that is not its own execution: %q", k.tenant, k.key, r.body)
	}
}

// observe records what a client of the round was told.
func (c *killCampaign) observe(k *keyRun, r reply) {
	c.mu.Lock()
	c.sent++
	switch {
	case r.status == http.StatusCreated && r.replayed():
		c.replays++
	case r.status == http.StatusCreated:
		c.created++
	case r.code() == "request_in_progress":
		c.inProgress++
	case r.code() == "outcome_pending":
		c.pending++
	default:
		c.unexpected = append(c.unexpected, fmt.Sprintf("%d %s", r.status, r.body))
	}
	c.mu.Unlock()
	if r.status != http.StatusCreated {
		return
	}
	c.checkAnswer(k, r)
	k.mu.Lock()
	defer k.mu.Unlock()
	got := r.comparable()
	if k.ack == nil {
		k.ack = &got
		return
	}
	if !assert.ObjectsAreEqual(*k.ack, got) {
		c.violate("key %s/%s: two different responses: %d %v %q and %d %v %q", k.tenant, k.key, k.ack.status, k.ack.header, k.ack.body, got.status, got.header, got.body)
	}
}

// observeAfterKill checks the answer a key gets from the restarted proxy.
func (c *killCampaign) observeAfterKill(k *keyRun, r reply) {
	k.mu.Lock()
	defer k.mu.Unlock()
	got := r.comparable()
	switch {
	case r.status == http.StatusCreated && r.replayed():
		switch {
		case k.interrupted:
			c.violate("key %s/%s answered 409 after a kill, then replayed: its outcome changed", k.tenant, k.key)
		case k.ack == nil:
			// Stored before the kill, though no client read it.
			c.mu.Lock()
			c.completedUnseen++
			c.mu.Unlock()
			k.ack = &got
		case !assert.ObjectsAreEqual(*k.ack, got):
			c.violate("key %s/%s: replay after a kill differs: had %q, got %q", k.tenant, k.key, k.ack.body, got.body)
		}
	case r.status == http.StatusCreated:
		switch {
		case k.ack != nil:
			c.violate("key %s/%s: acknowledged before the kill, executed again after it", k.tenant, k.key)
		case k.interrupted || k.ran:
			c.violate("key %s/%s: executed again after the kill", k.tenant, k.key)
		default:
			// The claim had not reached the disk: nothing ran yet.
			c.mu.Lock()
			c.freshAfterKill++
			c.mu.Unlock()
			k.ack, k.ran = &got, true
		}
	case r.code() == "request_in_progress" || r.code() == "outcome_pending":
		c.mu.Lock()
		if r.code() == "outcome_pending" {
			c.pendingAfterKill++
		} else {
			c.inProgressAfterKill++
		}
		c.mu.Unlock()
		if k.ack != nil && !k.interrupted {
			// A client read the whole response, yet the outcome is not
			// stored. The middleware sends an answer only once its
			// outcome is durable (a chunked one streams, but ends only
			// then), so a kill can never leave a client holding an answer
			// that its retry cannot get back.
			c.violate("key %s/%s: a client received %q, but after the kill it answers %d %s", k.tenant, k.key, k.ack.body, r.status, r.code())
		}
		k.interrupted = true
	default:
		c.violate("key %s/%s: after the kill: %d %s", k.tenant, k.key, r.status, r.body)
	}
}

// TestKillCampaign runs the campaign on the default sizing and, with half
// the kills, under the smallest memory budget, whose store flushes and
// compacts all the time.
func TestKillCampaign(t *testing.T) {
	t.Run("default", func(t *testing.T) { killCampaignRun(t, *kills) })
	t.Run("memory=4MiB", func(t *testing.T) { killCampaignRun(t, max(1, *kills/2), "--memory", "4MiB") })
}

func killCampaignRun(t *testing.T, kills int, extra ...string) {
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	up := startUpstream(t, 15*time.Millisecond)
	data := t.TempDir()
	args := proxyArgs(data, "127.0.0.1:"+freePort(t), up.url, append([]string{"--lease", killLease.String()}, extra...)...)
	c := &killCampaign{}
	client := newClient()

	proxy, url := startProxy(t, args)
	var inFlightKills, startupKills int
	for round := 1; round <= kills; round++ {
		keys := newRoundKeys(rng, "r", round)
		c.keys = append(c.keys, keys...)

		// Clients hammer the round's keys until the kill.
		ctx, cancel := context.WithCancel(context.Background())
		wg := c.load(ctx, client, seed, round, keys, func(*rand.Rand) string { return url }, c.observe)
		// A pause chosen at random places the kill among claims, upstream
		// calls and completions.
		time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
		proxy.Kill()
		inFlightKills++
		cancel()
		wg.Wait()
		client.CloseIdleConnections()
		checkStoreOpens(t, data)

		// Now and then a kill while the proxy is still opening its store.
		if rng.IntN(4) == 0 {
			p, err := crashtest.Start(idemBin, nil, args...)
			require.NoError(t, err)
			time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
			p.Kill()
			startupKills++
			checkStoreOpens(t, data)
		}

		proxy, url = startProxy(t, args)
		check := keys
		// Older keys must keep their answers through every later kill.
		for range 16 {
			if k := c.keys[rng.IntN(len(c.keys))]; k.round < round {
				check = append(check, k)
			}
		}
		for _, k := range check {
			r, err := do(context.Background(), client, "POST", url+chargePath, k.body, k.headers()...)
			require.NoError(t, err, "the restarted proxy must answer")
			if r.status == http.StatusCreated {
				c.checkAnswer(k, r)
			}
			c.observeAfterKill(k, r)
		}
		duplicates := checkJournal(t, c, up)
		require.Zero(t, duplicates, "no key may execute twice")
		require.Empty(t, c.violations, "round %d", round)
	}

	// Once the dead proxies' leases have run out, every interrupted key
	// answers outcome_pending, and still nothing runs again.
	var interrupted []*keyRun
	for _, k := range c.keys {
		if k.interrupted {
			interrupted = append(interrupted, k)
		}
	}
	deadline := time.Now().Add(guard)
	for len(interrupted) > 0 {
		k := interrupted[0]
		r, err := do(context.Background(), client, "POST", url+chargePath, k.body, k.headers()...)
		require.NoError(t, err)
		c.observeAfterKill(k, r)
		if r.code() == "outcome_pending" {
			interrupted = interrupted[1:]
			continue
		}
		require.Equal(t, "request_in_progress", r.code(), "%d %s", r.status, r.body)
		require.True(t, time.Now().Before(deadline), "the lease of %s/%s never ran out", k.tenant, k.key)
		time.Sleep(50 * time.Millisecond) // paces the polling; the answer decides
	}
	require.Zero(t, checkJournal(t, c, up))
	require.Empty(t, c.violations)

	// Stop the last proxy cleanly and read every key with the library.
	require.NoError(t, proxy.Signal(syscall.SIGTERM))
	code, err := proxy.Wait(guard)
	require.NoError(t, err)
	require.Equal(t, 0, code, proxy.Stderr())
	lost := checkFinalStore(t, c, data)

	c.mu.Lock()
	defer c.mu.Unlock()
	assert.Empty(t, c.violations)
	assert.Empty(t, c.unexpected, "answers outside the contract")
	assert.Zero(t, lost, "acknowledged results lost")
	var acked, cutOff int
	for _, k := range c.keys {
		if k.ack != nil && !k.interrupted {
			acked++
		}
		if k.interrupted {
			cutOff++
		}
	}
	t.Logf("kills survived: %d (%d with requests in flight, %d while starting)", inFlightKills+startupKills, inFlightKills, startupKills)
	t.Logf("keys: %d; executions journalled: %d; replayable after every kill: %d; interrupted (409 ever since): %d", len(c.keys), up.executions(t), acked, cutOff)
	t.Logf("requests: %d (201 first: %d, 201 replayed: %d, 409 in progress: %d, 409 pending: %d), transport errors at kills: %d",
		c.sent, c.created, c.replays, c.inProgress, c.pending, c.transportErrs)
	t.Logf("after kills: completed but unseen by clients: %d; claim lost with the kill, ran fresh: %d; 409 request_in_progress: %d, 409 outcome_pending: %d",
		c.completedUnseen, c.freshAfterKill, c.inProgressAfterKill, c.pendingAfterKill)
	t.Logf("duplicates found: 0; acknowledged results lost: %d", lost)
}

// checkJournal returns how many keys the journal shows executed more than
// once, and checks that each acknowledged response came from the one
// execution the journal holds for its key.
func checkJournal(t *testing.T, c *killCampaign, up *upstreamProc) int {
	t.Helper()
	execs, err := crashtest.ReadJournal(up.journal)
	require.NoError(t, err)
	serials := map[string][]uint64{}
	for _, e := range execs {
		k := crashtest.TenantKey(e.Tenant, e.Key)
		serials[k] = append(serials[k], e.Serial)
	}
	dups := 0
	for k, s := range serials {
		if len(s) > 1 {
			dups++
			c.violate("%q executed %d times: serials %v", k, len(s), s)
		}
	}
	for _, k := range c.keys {
		k.mu.Lock()
		if k.ack != nil {
			var a crashtest.Answer
			s := serials[crashtest.TenantKey(k.tenant, k.key)]
			if json.Unmarshal(k.ack.body, &a) != nil || len(s) == 0 || s[0] != a.Serial {
				c.violate("key %s/%s: acknowledged %q, journal has %v", k.tenant, k.key, k.ack.body, s)
			}
		}
		k.mu.Unlock()
	}
	return dups
}

// checkStoreOpens opens the store the killed proxy left, with the library,
// and decodes every record in it.
func checkStoreOpens(t *testing.T, dir string) {
	t.Helper()
	db, err := pebblestore.Open(dir, &pebblestore.Options{SweepInterval: -1, MustExist: true, Logger: quietLogger()})
	require.NoError(t, err, "the store must open after a kill")
	for _, err := range db.Records(context.Background(), idem.Filter{Expired: true}) {
		require.NoError(t, err)
	}
	require.NoError(t, db.Close())
}

// checkFinalStore reads every key of the campaign with the library and
// returns how many acknowledged results are not there.
func checkFinalStore(t *testing.T, c *killCampaign, dir string) (lost int) {
	t.Helper()
	db, err := pebblestore.Open(dir, &pebblestore.Options{SweepInterval: -1, MustExist: true, Logger: quietLogger()})
	require.NoError(t, err)
	defer db.Close()
	counts := map[string]int{}
	for rec, err := range db.Records(context.Background(), idem.Filter{Expired: true}) {
		require.NoError(t, err)
		counts[rec.State.String()]++
	}
	t.Logf("final store: records by state %v", counts)
	for _, k := range c.keys {
		rec, err := db.Get(context.Background(), idem.Scope{Tenant: k.tenant, Endpoint: chargeEndpoint, Key: k.key})
		switch {
		case k.interrupted || k.ack != nil:
			if !keptAsAnswered(t, k, rec, err) {
				lost++
			}
		default:
			// Never answered with an outcome: no record, or one that is
			// not completed.
			if err == nil {
				assert.NotEqual(t, idem.StateCompleted, rec.State, "key %s/%s", k.tenant, k.key)
			} else {
				assert.ErrorIs(t, err, idem.ErrNotFound)
			}
		}
	}
	return lost
}

// keptAsAnswered checks what the store holds for k, a key that was
// interrupted or acknowledged, as the store's Get returned it: an
// interrupted key keeps its record in progress or unknown; an
// acknowledged one holds exactly the answer a client received. It reports
// false when an acknowledged answer was lost.
func keptAsAnswered(t *testing.T, k *keyRun, rec *idem.Record, err error) bool {
	t.Helper()
	if k.interrupted {
		if assert.NoError(t, err, "interrupted key %s/%s must keep its record", k.tenant, k.key) {
			assert.Contains(t, []idem.State{idem.StateInProgress, idem.StateUnknown}, rec.State)
		}
		return true
	}
	if err != nil || rec.State != idem.StateCompleted || string(rec.Response.Body) != string(k.ack.body) || rec.Response.Status != k.ack.status {
		t.Errorf("key %s/%s: acknowledged %q, stored %v %v", k.tenant, k.key, k.ack.body, rec, err)
		return false
	}
	return true
}

// freePort returns a port nobody listens on now; the proxy is restarted on
// it after every kill.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	return port
}

func randomToken(rng *rand.Rand) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
	b := make([]byte, 12)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// newRoundKeys makes the keys of one round, named after prefix and the
// round, spread over three tenants.
func newRoundKeys(rng *rand.Rand, prefix string, round int) []*keyRun {
	keys := make([]*keyRun, roundKeys)
	for i := range keys {
		tenant := fmt.Sprintf("tenant-%d", rng.IntN(3))
		key := fmt.Sprintf("%s%d-k%d-%s", prefix, round, i, randomToken(rng))
		keys[i] = &keyRun{tenant: tenant, key: key, round: round,
			body: fmt.Sprintf(`{"amount": %d, "currency": "usd", "ref": %q}`, 100+rng.IntN(10_000), key)}
	}
	return keys
}

// load starts roundClients clients that send the round's keys until ctx
// ends, each attempt to the proxy that target picks, hands every answer to
// observe (the campaign's own judge of it), and returns what to wait on
// for them. Keys still in flight are sent most, so that claims and
// completions overlap a kill rather than replays.
func (c *killCampaign) load(ctx context.Context, client *http.Client, seed uint64, round int, keys []*keyRun,
	target func(*rand.Rand) string, observe func(*keyRun, reply)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range roundClients {
		wg.Go(func() {
			wrng := rand.New(rand.NewPCG(seed, uint64(round*1000+w)))
			for ctx.Err() == nil {
				k := keys[wrng.IntN(len(keys))]
				k.mu.Lock()
				done := k.ack != nil
				k.mu.Unlock()
				if done && wrng.IntN(8) != 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				r, err := do(ctx, client, "POST", target(wrng)+chargePath, k.body, k.headers()...)
				if err != nil {
					c.mu.Lock()
					c.transportErrs++
					c.mu.Unlock()
					continue
				}
				observe(k, r)
			}
		})
	}
	return &wg
}
