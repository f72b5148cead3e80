package reliability_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/pebblestore"
)

// TestTenantFlood: invented tenants mint keys as fast as they can, through
// the middleware behind idem.Limit with a table far smaller than their
// number. Each gets its burst and then 429 with nothing stored, the
// victim's retry still replays byte for byte, and its new key still runs.
func TestTenantFlood(t *testing.T) {
	db, clock := idemtest.Open(t, &pebblestore.Options{Logger: quietLogger()})
	store, err := idem.Limit(db, idem.Limits{ClaimRate: 1, ClaimBurst: 2, Tenants: 100, Now: clock.Now})
	require.NoError(t, err)
	mw, err := idemhttp.New(idemhttp.Options{Store: store, Tenant: tenantFromHeader, Logger: quietLogger()})
	require.NoError(t, err)
	ran := 0
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, ran)
	}))
	call := func(tenant, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.HeaderKey, key)
		req.Header.Set(crashtest.TenantHeader, tenant)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	first := call("victim", "v1")
	require.Equal(t, http.StatusCreated, first.Code)

	const tenants, keys = 2000, 4
	limited := 0
	for i := range tenants {
		tenant := fmt.Sprintf("flood-%d", i)
		for k := range keys {
			w := call(tenant, fmt.Sprint("k", k))
			if k < 2 {
				require.Equal(t, http.StatusCreated, w.Code, "%s's burst", tenant)
				continue
			}
			require.Equal(t, http.StatusTooManyRequests, w.Code, "%s key %d", tenant, k)
			assert.NotEmpty(t, w.Header().Get("Retry-After"))
			limited++
		}
		if i%500 == 0 {
			again := call("victim", "v1")
			require.Equal(t, http.StatusCreated, again.Code)
			assert.Equal(t, first.Body.String(), again.Body.String(), "the victim's retry replays during the flood")
		}
	}
	assert.Equal(t, http.StatusCreated, call("victim", "v2").Code, "the victim is not slowed")
	assert.Equal(t, 1+tenants*2+1, ran)
	n := 0
	for _, err := range db.Records(t.Context(), idem.Filter{Expired: true}) {
		require.NoError(t, err)
		n++
	}
	assert.Equal(t, ran, n, "a refused key stores nothing")
	t.Logf("%d invented tenants, %d new keys refused with 429, %d stored", tenants, limited, n)
}
