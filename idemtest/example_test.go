package idemtest_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
)

// A test of code that claims keys runs it on a MemStore: the first call
// runs and stores its answer, a retry replays it, and another request
// under the same key is refused.
func ExampleMemStore() {
	store, err := idemtest.NewMemStore(&idemtest.MemOptions{Now: idemtest.NewClock().Now})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	ctx := context.Background()
	s := idem.Scope{Tenant: "acct_42", Endpoint: "POST /v1/payments", Key: "key-1"}
	charge := func(body string) {
		lease, replay, err := store.Claim(ctx, s, sha256.Sum256([]byte(body)))
		switch {
		case errors.Is(err, idem.ErrFingerprintMismatch):
			fmt.Println("refused: the key belongs to another request")
		case err != nil:
			log.Fatal(err)
		case replay != nil:
			fmt.Printf("replayed %d %s\n", replay.Response.Status, replay.Response.Body)
		default:
			resp := idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}
			if err := lease.Complete(ctx, resp); err != nil {
				log.Fatal(err)
			}
			fmt.Printf("ran %d %s\n", resp.Status, resp.Body)
		}
	}
	charge(`{"amount":4200}`)
	charge(`{"amount":4200}`)
	charge(`{"amount":9900}`)
	// Output:
	// ran 201 {"id":"pay_1"}
	// replayed 201 {"id":"pay_1"}
	// refused: the key belongs to another request
}
