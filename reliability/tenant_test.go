package reliability_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	pubidemtest "github.com/idemkv/idem/idemtest"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pebblestore"
	"github.com/idemkv/idem/pgstore"
)

// Tenants and endpoints chosen so that naive encodings collide: one tenant
// is a prefix of another, a tenant with the start of an endpoint spells
// another tenant with the rest of it, one contains NUL, one is empty.
var (
	isoTenants   = []string{"", "a", "ab", "a\x00", "b", "A"}
	isoEndpoints = []string{"POST /x", "bPOST /x", "POST /xb"}
	isoKeys      = []string{"k", "kk", "k\x00"}
	isoPrints    = []idem.Fingerprint{sha256.Sum256([]byte("one")), sha256.Sum256([]byte("two"))}
)

// modelRecord is what the property test expects the store to hold for one
// scope.
type modelRecord struct {
	claim      int // which claim made it; leases carry it too
	state      idem.State
	fp         idem.Fingerprint
	body       string
	leaseUntil time.Time
	expiresAt  time.Time
}

type heldLease struct {
	l     idem.Lease
	scope idem.Scope
	claim int
}

// TestTenantIsolationProperty runs random sequences of every operation
// that reads or writes a record (Claim, Complete, Release, MarkUnknown,
// TakeOver, Get, Records by tenant and endpoint, Sweep) over scopes that
// share keys across tenants, against a model kept per full scope, on the
// embedded store and on PostgreSQL. Every answer must match the model; in
// particular no tenant ever gets a lease, a replay, a record or a listing
// entry that belongs to another, and a key one tenant spent never refuses
// another.
func TestTenantIsolationProperty(t *testing.T) {
	stores := []struct {
		name      string
		sequences int
		// sep joins names into colliding ones: NUL where the store takes
		// it, and for PostgreSQL, whose text refuses NUL, the byte after.
		sep  string
		open func(t *testing.T) (idem.Operator, *pubidemtest.Clock)
	}{
		{"embedded", 200, "\x00", func(t *testing.T) (idem.Operator, *pubidemtest.Clock) {
			db, clock := idemtest.Open(t, &pebblestore.Options{Lease: isoLease, TTL: isoTTL, Logger: quietLogger()})
			return db, clock
		}},
		// Each sequence gets a database of its own, which costs more.
		{"postgres", 40, "\x01", func(t *testing.T) (idem.Operator, *pubidemtest.Clock) {
			clock := pubidemtest.NewClock()
			s, err := pgstore.Open(t.Context(), pgtest.DSN(t), &pgstore.Options{Lease: isoLease, TTL: isoTTL, Now: clock.Now, Logger: quietLogger()})
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			return s, clock
		}},
	}
	base := seedFor(t)
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			ops := 0
			for seq := range st.sequences {
				seed := base + uint64(seq)
				ok := t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
					db, clock := st.open(t)
					ops += runIsolationSequence(t, rand.New(rand.NewPCG(seed, 2)), isoSteps, db, clock, st.sep)
				})
				if !ok {
					break
				}
			}
			t.Logf("tenant isolation: %d sequences, %d operations, no cross-tenant answer", st.sequences, ops)
		})
	}
}

// The property test's lease and TTL, and the length of one sequence.
const (
	isoLease, isoTTL = 30 * time.Second, time.Hour
	isoSteps         = 300
)

func runIsolationSequence(t *testing.T, rng *rand.Rand, steps int, db idem.Operator, clock *pubidemtest.Clock, sep string) int {
	tenants, keys := make([]string, len(isoTenants)), make([]string, len(isoKeys))
	for i, v := range isoTenants {
		tenants[i] = strings.ReplaceAll(v, "\x00", sep)
	}
	for i, v := range isoKeys {
		keys[i] = strings.ReplaceAll(v, "\x00", sep)
	}
	ctx := context.Background()
	model := map[idem.Scope]*modelRecord{}
	var held []heldLease
	claims := 0
	pick := func() idem.Scope {
		return idem.Scope{Tenant: tenants[rng.IntN(len(tenants))], Endpoint: isoEndpoints[rng.IntN(len(isoEndpoints))], Key: keys[rng.IntN(len(keys))]}
	}
	live := func(s idem.Scope) *modelRecord {
		m := model[s]
		if m == nil || !clock.Now().Before(m.expiresAt) {
			return nil
		}
		return m
	}
	// bodyFor names the scope and the claim: a body shown to the wrong
	// tenant, or from another claim, is recognisable.
	bodyFor := func(s idem.Scope, claim int) string {
		return fmt.Sprintf("%q|%q|%q|%d", s.Tenant, s.Endpoint, s.Key, claim)
	}
	// end applies one of the ways a lease ends and checks it against the
	// model.
	end := func(h heldLease) {
		m := live(h.scope)
		valid := m != nil && m.claim == h.claim && m.state == idem.StateInProgress
		var err error
		var next func()
		switch rng.IntN(4) {
		case 0, 1:
			body := bodyFor(h.scope, h.claim)
			err = h.l.Complete(ctx, idem.Response{Status: 201, Body: []byte(body)})
			next = func() { m.state, m.body = idem.StateCompleted, body }
		case 2:
			err = h.l.Release(ctx)
			next = func() { delete(model, h.scope) }
		default:
			err = h.l.MarkUnknown(ctx)
			next = func() { m.state, m.leaseUntil = idem.StateUnknown, clock.Now() }
		}
		if valid {
			require.NoError(t, err, "%+v", h.scope)
			next()
		} else {
			require.ErrorIs(t, err, idem.ErrLeaseLost, "%+v", h.scope)
		}
	}

	for range steps {
		s := pick()
		switch op := rng.IntN(10); {
		case op < 4: // claim
			fp := isoPrints[rng.IntN(len(isoPrints))]
			l, rec, err := db.Claim(ctx, s, fp)
			m := live(s)
			now := clock.Now()
			switch {
			case m == nil:
				require.NoError(t, err, "%+v", s)
				require.NotNil(t, l)
				require.Equal(t, s, l.Scope(), "a lease for the scope asked, no other")
				claims++
				// The times are the store's own: a store may add a margin.
				r := l.Record()
				require.False(t, r.LeaseUntil.Before(now.Add(isoLease)), "a lease shorter than asked")
				require.False(t, r.ExpiresAt.Before(now.Add(isoTTL)), "a TTL shorter than asked")
				model[s] = &modelRecord{claim: claims, state: idem.StateInProgress, fp: fp, leaseUntil: r.LeaseUntil, expiresAt: r.ExpiresAt}
				held = append(held, heldLease{l, s, claims})
			case m.fp != fp:
				require.ErrorIs(t, err, idem.ErrFingerprintMismatch, "%+v", s)
			case m.state == idem.StateCompleted:
				require.NoError(t, err)
				require.NotNil(t, rec, "%+v", s)
				require.Equal(t, s, rec.Scope, "a replay of the scope asked, no other")
				require.Equal(t, m.body, string(rec.Response.Body))
			case m.state == idem.StateInProgress && now.Before(m.leaseUntil):
				require.ErrorIs(t, err, idem.ErrInProgress, "%+v", s)
			default:
				require.ErrorIs(t, err, idem.ErrOutcomePending, "%+v", s)
			}
			var ke *idem.KeyError
			if errors.As(err, &ke) {
				assert.Equal(t, s.Tenant, ke.Tenant, "a refusal names the caller's own tenant")
				assert.Equal(t, s.Endpoint, ke.Endpoint)
			}
		case op < 6: // end a lease
			if len(held) == 0 {
				continue
			}
			i := rng.IntN(len(held))
			h := held[i]
			held = append(held[:i], held[i+1:]...)
			end(h)
		case op < 7: // take over
			l, err := db.TakeOver(ctx, s)
			m := live(s)
			switch {
			case m == nil:
				require.ErrorIs(t, err, idem.ErrNotFound, "%+v", s)
			case m.state == idem.StateCompleted:
				require.ErrorIs(t, err, idem.ErrCompleted)
			case m.state == idem.StateInProgress && clock.Now().Before(m.leaseUntil):
				require.ErrorIs(t, err, idem.ErrInProgress)
			default:
				require.NoError(t, err, "%+v", s)
				require.Equal(t, s, l.Scope())
				claims++
				m.claim, m.state, m.leaseUntil = claims, idem.StateInProgress, l.Record().LeaseUntil
				held = append(held, heldLease{l, s, claims})
			}
		case op < 8: // read one record
			rec, err := db.Get(ctx, s)
			m := live(s)
			if m == nil {
				require.ErrorIs(t, err, idem.ErrNotFound, "%+v", s)
				continue
			}
			require.NoError(t, err)
			require.Equal(t, s, rec.Scope)
			require.Equal(t, m.state, rec.State)
			require.Equal(t, m.fp, rec.Fingerprint)
			if m.state == idem.StateCompleted {
				require.Equal(t, m.body, string(rec.Response.Body))
			}
		case op < 9: // list a tenant, or a tenant's endpoint
			if s.Tenant == "" {
				continue // an empty Filter.Tenant lists every tenant by design
			}
			f := idem.Filter{Tenant: s.Tenant}
			if rng.IntN(2) == 0 {
				f.Endpoint = s.Endpoint
			}
			got := map[idem.Scope]idem.State{}
			for rec, err := range db.Records(ctx, f) {
				require.NoError(t, err)
				require.Equal(t, s.Tenant, rec.Scope.Tenant, "a listing of one tenant shows only that tenant")
				got[rec.Scope] = rec.State
			}
			want := map[idem.Scope]idem.State{}
			for sc := range model {
				if m := live(sc); m != nil && sc.Tenant == f.Tenant && (f.Endpoint == "" || sc.Endpoint == f.Endpoint) {
					want[sc] = m.state
				}
			}
			require.Equal(t, want, got)
		default: // time passes; sometimes past leases, sometimes past the TTL
			clock.Advance([]time.Duration{time.Second, isoLease, 20 * time.Minute}[rng.IntN(3)])
			if rng.IntN(2) == 0 {
				_, err := db.Sweep(ctx)
				require.NoError(t, err)
			}
		}
	}
	for _, h := range held {
		end(h)
	}
	return steps
}

// TestTenantIsolationHTTP sends random requests from several tenants that
// share keys and bodies through the middleware: every answer a tenant gets
// is its own execution, a replay of its own, or a refusal about its own
// key; a key another tenant spent never gets 422 or 409, which would tell
// one tenant what another did.
func TestTenantIsolationHTTP(t *testing.T) {
	db, _ := idemtest.Open(t, &pebblestore.Options{Logger: quietLogger()})
	runs := map[string]int{}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.Header.Get("X-Tenant")
		runs[tenant+"\x00"+r.Header.Get("Idempotency-Key")]++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"tenant":%q,"run":%d}`, tenant, len(runs))
	})
	mw, err := idemhttp.New(idemhttp.Options{Store: db, Logger: quietLogger(), Tenant: func(r *http.Request) (string, error) {
		v := r.Header.Get("X-Tenant")
		if v == "" {
			return "", errors.New("no tenant")
		}
		return v, nil
	}})
	require.NoError(t, err)
	h := mw(app)
	tenants := []string{"acme", "acme2", "Acme", "ac", "me"}
	keys := []string{"key-1", "key-2", "key-3"}
	bodies := []string{`{"amount":1}`, `{"amount":2}`}
	type scopeKey struct{ tenant, key string }
	first := map[scopeKey]string{} // the first body a tenant sent with a key
	answers := map[scopeKey][]byte{}
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	const requests = 3000
	for range requests {
		sk := scopeKey{tenants[rng.IntN(len(tenants))], keys[rng.IntN(len(keys))]}
		body := bodies[rng.IntN(len(bodies))]
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", sk.key)
		req.Header.Set("X-Tenant", sk.tenant)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		sent, seen := first[sk]
		switch {
		case !seen:
			// This tenant's first use of the key runs, whatever other
			// tenants did with it.
			require.Equal(t, http.StatusCreated, w.Code, "seed %d: %s", seed, w.Body)
			require.Empty(t, w.Header().Get("Idempotent-Replayed"))
			var a struct{ Tenant string }
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &a))
			require.Equal(t, sk.tenant, a.Tenant)
			first[sk], answers[sk] = body, w.Body.Bytes()
		case sent == body:
			require.Equal(t, http.StatusCreated, w.Code, "seed %d", seed)
			require.Equal(t, "true", w.Header().Get("Idempotent-Replayed"))
			require.Equal(t, answers[sk], w.Body.Bytes(), "a replay of the tenant's own answer")
		default:
			require.Equal(t, http.StatusUnprocessableEntity, w.Code, "the tenant's own key, reused")
		}
	}
	for sk := range first {
		assert.Equal(t, 1, runs[sk.tenant+"\x00"+sk.key])
	}
	assert.Len(t, runs, len(first))
	t.Logf("tenant isolation over HTTP: %d requests, %d tenant-key pairs, each run once (seed %d)", requests, len(first), seed)
}

// TestTenantIsolationProxy is TestTenantIsolationHTTP through real proxies,
// on each store: one proxy on the embedded store, three replicas sharing
// one PostgreSQL database, each request sent to a random one. A tenant's
// first use of a key runs on the upstream as its own, whichever replica
// takes it; every later answer is a replay of its own answer or a 422
// about its own key; the upstream runs each tenant-key pair once; and the
// store holds one record per pair, under the tenant that made it.
func TestTenantIsolationProxy(t *testing.T) {
	for _, ps := range proxyStores {
		t.Run("store="+ps.name, func(t *testing.T) {
			store := ps.new(t)
			up := startUpstream(t, 0)
			var procs []*crashtest.Process
			var urls []string
			for range ps.replicas {
				p, url := startProxy(t, store.args("127.0.0.1:0", up.url))
				procs, urls = append(procs, p), append(urls, url)
			}
			tenantIsolationProxy(t, up, urls)
			for _, p := range procs {
				require.NoError(t, p.Signal(syscallTERM()))
				code, err := p.Wait(guard)
				require.NoError(t, err)
				require.Equal(t, 0, code, p.Stderr())
			}
			execs, err := crashtest.ReadJournal(up.journal)
			require.NoError(t, err)
			ran := map[string]bool{}
			for _, e := range execs {
				ran[crashtest.TenantKey(e.Tenant, e.Key)] = true
			}
			recs := store.records(t)
			stored := map[string]bool{}
			for _, rec := range recs {
				assert.Equal(t, idem.StateCompleted, rec.State)
				var a crashtest.Answer
				if assert.NoError(t, json.Unmarshal(rec.Response.Body, &a)) {
					assert.Equal(t, rec.Scope.Tenant, a.Tenant, "a record holds another tenant's answer")
					assert.Equal(t, rec.Scope.Key, a.Key)
				}
				stored[crashtest.TenantKey(rec.Scope.Tenant, rec.Scope.Key)] = true
			}
			assert.Len(t, recs, len(execs), "one record per execution")
			assert.Equal(t, ran, stored, "the stored pairs are those that ran")
		})
	}
}

// tenantIsolationProxy sends random requests of several tenants sharing
// keys and bodies to the proxies at urls and checks each answer.
func tenantIsolationProxy(t *testing.T, up *upstreamProc, urls []string) {
	client := newClient()
	tenants := []string{"acme", "acme2", "Acme", "ac", "me"}
	keys := []string{"key-1", "key-2", "key-3"}
	bodies := []string{`{"amount":1}`, `{"amount":2}`}
	type scopeKey struct{ tenant, key string }
	first := map[scopeKey]string{} // the first body a tenant sent with a key
	answers := map[scopeKey][]byte{}
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	const requests = 1000
	for range requests {
		sk := scopeKey{tenants[rng.IntN(len(tenants))], keys[rng.IntN(len(keys))]}
		body := bodies[rng.IntN(len(bodies))]
		r, err := do(context.Background(), client, "POST", urls[rng.IntN(len(urls))]+chargePath, body,
			"Idempotency-Key", sk.key, crashtest.TenantHeader, sk.tenant)
		require.NoError(t, err)
		sent, seen := first[sk]
		switch {
		case !seen:
			require.Equal(t, http.StatusCreated, r.status, "seed %d: %s", seed, r.body)
			require.False(t, r.replayed())
			var a crashtest.Answer
			require.NoError(t, json.Unmarshal(r.body, &a))
			require.Equal(t, sk.tenant, a.Tenant)
			require.Equal(t, sk.key, a.Key)
			first[sk], answers[sk] = body, r.body
		case sent == body:
			require.Equal(t, http.StatusCreated, r.status, "seed %d: %s", seed, r.body)
			require.True(t, r.replayed())
			require.Equal(t, answers[sk], r.body, "a replay of the tenant's own answer")
		default:
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "the tenant's own key, reused")
			require.Equal(t, idem.CodeKeyReuse, r.code())
		}
	}
	assert.Equal(t, len(first), up.executions(t), "each tenant-key pair runs once")
	t.Logf("tenant isolation through %d proxies: %d requests, %d tenant-key pairs, each run once (seed %d)", len(urls), requests, len(first), seed)
}
