package pebblestore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

// The claim lifecycle: the first request runs and stores its response, a
// retry replays it, and the same key with another payload is refused.
func Example() {
	// A real service passes a directory and nil options.
	db, err := pebblestore.Open("payments", pebblefs.With(&pebblestore.Options{}, vfs.NewMem()))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	s := idem.Scope{Tenant: "acct_42", Endpoint: "POST /v1/payments", Key: "4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90"}
	charge := func(body string) {
		lease, replay, err := db.Claim(ctx, s, sha256.Sum256([]byte(body)))
		switch {
		case errors.Is(err, idem.ErrFingerprintMismatch):
			fmt.Println("422: key reused with another payload")
		case err != nil:
			log.Fatal(err)
		case replay != nil:
			fmt.Printf("replayed %d %s\n", replay.Response.Status, replay.Response.Body)
		default:
			// The claim is durable: run the operation exactly once.
			resp := idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}
			if err := lease.Complete(ctx, resp); err != nil {
				log.Fatal(err)
			}
			fmt.Printf("executed %d %s\n", resp.Status, resp.Body)
		}
	}
	charge(`{"amount":4200}`)
	charge(`{"amount":4200}`)
	charge(`{"amount":9900}`)
	// Output:
	// executed 201 {"id":"pay_1"}
	// replayed 201 {"id":"pay_1"}
	// 422: key reused with another payload
}
