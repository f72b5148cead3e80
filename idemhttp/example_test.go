package idemhttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idem/idemhttp"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

func Example() {
	db, err := pebblestore.Open("idem-data", pebblefs.With(&pebblestore.Options{}, vfs.NewMem())) // a real service: a directory, nil options
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idemhttp.New(idemhttp.Options{
		Store: db,
		// Scope keys by the authenticated caller.
		Tenant: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(body string) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test_1")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(b)))
	}
	post(`{"amount":4200,"currency":"usd"}`)
	post(`{"currency":"usd","amount":4.2e3}`) // the same request, re-serialized
	post(`{"amount":9900,"currency":"usd"}`)  // the same key, another request
	fmt.Println("charges:", charges)
	// Output:
	// 201  {"id":"pay_1"}
	// 201 true {"id":"pay_1"}
	// 422  {"type":"https://github.com/idemkv/idem/blob/main/docs/problems.md#idempotency_key_reuse","title":"Unprocessable Entity","status":422,"detail":"this idempotency key was used for a different request; use a new key for a new operation","code":"idempotency_key_reuse"}
	// charges: 1
}

// A handler behind a rate limiter answers 429 before it does anything, so
// that answer frees the key instead of being replayed: the retry runs.
func ExampleOutcomePolicy() {
	db, err := pebblestore.Open("idem-data", pebblefs.With(&pebblestore.Options{}, vfs.NewMem()))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idemhttp.New(idemhttp.Options{
		Store:    db,
		Tenant:   func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		Outcomes: idemhttp.OutcomePolicy{Release: []int{http.StatusTooManyRequests}},
	})
	if err != nil {
		log.Fatal(err)
	}
	calls := 0
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls++; calls == 1 {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/payments", strings.NewReader(`{"amount":4200}`))
		req.Header.Set("Authorization", "Bearer sk_test_1")
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("calls:", calls)
	// Output:
	// 429 replayed: false
	// 201 replayed: false
	// 201 replayed: true
	// calls: 2
}
