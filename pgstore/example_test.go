package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/pgstore"
)

// A payment and its idempotency record commit in one transaction: a
// retry either replays the committed answer or, after a rollback, runs
// the payment again.
func ExampleStore_InTx() {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	sc := idem.Scope{Tenant: "acme", Endpoint: "POST /v1/payments", Key: "3f2a9c"}
	fp := idem.Fingerprint{} // from idem.Request.Fingerprint in real use
	resp, replayed, err := s.InTx(ctx, sc, fp, func(ctx context.Context, tx pgx.Tx) (idem.Response, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO payments (key, amount) VALUES ($1, $2)", sc.Key, 100); err != nil {
			return idem.Response{}, err // rolled back: the key stays free
		}
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
	})
	var ke *idem.KeyError
	switch {
	case errors.As(err, &ke):
		fmt.Println("refused:", ke.Err, "retry after", ke.RetryAfter)
	case err != nil:
		fmt.Println("store unavailable:", err)
	default:
		fmt.Println(resp.Status, replayed)
	}
}
