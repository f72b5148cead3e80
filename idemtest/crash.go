package idemtest

import (
	"context"

	"github.com/idemkv/idem"
)

// Forgetful wraps s so that every outcome its leases record is lost, as
// when a process dies between running an operation and storing its answer:
// each record it claims stays in progress until its lease runs out. Tests
// of reconciliation and of the answers to overdue claims use it instead of
// killing a process.
func Forgetful(s idem.Store) idem.Store { return forgetfulStore{s} }

type forgetfulStore struct{ idem.Store }

func (s forgetfulStore) Claim(ctx context.Context, sc idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	l, rec, err := s.Store.Claim(ctx, sc, fp)
	if l != nil {
		l = forgottenLease{l}
	}
	return l, rec, err
}

type forgottenLease struct{ idem.Lease }

func (forgottenLease) Complete(context.Context, idem.Response) error { return nil }
func (forgottenLease) Release(context.Context) error                 { return nil }
func (forgottenLease) MarkUnknown(context.Context) error             { return nil }
func (forgottenLease) MarkFailed(context.Context) error              { return nil }
