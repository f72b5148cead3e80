package idem_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
)

// A payment runs once however often its key comes back: the retry gets
// the stored answer, and the same key with another amount is refused.
func ExampleDo() {
	store, err := idemtest.NewMemStore(nil) // pebblestore.Open or pgstore.Open in a service
	if err != nil {
		panic(err)
	}
	defer store.Close()
	charges := 0
	pay := func(amount string) {
		s := idem.Scope{Tenant: "acct_1", Endpoint: "POST /v1/payments", Key: "order-17"}
		fp := idem.Fingerprint(sha256.Sum256([]byte(amount)))
		res, err := idem.Do(context.Background(), store, s, fp, nil, func(ctx context.Context, l idem.Lease) (idem.Response, error) {
			charges++ // the charge, sent with idem.DownstreamKey(l.Scope(), "charge")
			return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
		})
		switch {
		case errors.Is(err, idem.ErrFingerprintMismatch):
			fmt.Println(idem.Refuse(err, "request").Code)
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Println(res.Response.Status, string(res.Response.Body), "replayed:", res.Replayed != nil)
		}
	}
	pay("4200")
	pay("4200")
	pay("9900")
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
	// idempotency_key_reuse
	// charges: 1
}
