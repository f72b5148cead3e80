package idemprom_test

import (
	"bufio"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/idemprom"
	"github.com/idemkv/idem/pebblestore"
)

// Wiring a service: the store's collector and the middleware's observer
// on one registry, served as /metrics.
func Example() {
	dir, err := os.MkdirTemp("", "idemprom-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := pebblestore.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	reg := prometheus.NewRegistry()
	col, err := idemprom.NewCollector(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	obs, err := idemprom.NewObserver(nil)
	if err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(col, obs)

	mw, err := idemhttp.New(idemhttp.Options{
		Store:   db,
		Tenant:  func(*http.Request) (string, error) { return "acct_42", nil },
		Observe: obs.Observe,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	// A payment, its retry, and the same key for another amount.
	for _, body := range []string{`{"amount":4200}`, `{"amount":4200}`, `{"amount":9900}`} {
		req := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90")
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range []string{"idem_http_requests_total", "idem_claims_total", "idem_replays_total", "idem_mismatches_total", "idem_replay_ratio"} {
			if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// idem_claims_total 1
	// idem_http_requests_total{code="201",endpoint="POST /v1/payments",outcome="executed"} 1
	// idem_http_requests_total{code="201",endpoint="POST /v1/payments",outcome="replayed"} 1
	// idem_http_requests_total{code="422",endpoint="POST /v1/payments",outcome="idempotency_key_reuse"} 1
	// idem_mismatches_total 1
	// idem_replay_ratio 0.5
	// idem_replays_total 1
}
