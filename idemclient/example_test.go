package idemclient_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idem/idemclient"
)

// A POST whose first attempt meets a 503 is sent again with the same key.
func Example() {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	store := &idemclient.MemoryKeyStore{} // or NewStoreKeyStore, to survive restarts
	tr, err := idemclient.NewTransport(&idemclient.Options{
		KeyStore: store,
		Backoff:  idemclient.FullJitter(time.Millisecond, 10*time.Millisecond, nil),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	ctx := idemclient.WithOperation(context.Background(), "order-1042")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders",
		strings.NewReader(`{"sku":"tea","qty":2}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()

	key, done, _ := store.Lookup(context.Background(), "order-1042")
	fmt.Println("status:", resp.StatusCode)
	fmt.Println("attempts:", idemclient.Attempts(resp))
	fmt.Println("replayed:", idemclient.Replayed(resp))
	fmt.Println("same key on every attempt:", keys[0] == keys[1] && keys[0] == key)
	fmt.Println("operation done with:", done)
	// Output:
	// status: 201
	// attempts: 2
	// replayed: false
	// same key on every attempt: true
	// operation done with: 201
}
