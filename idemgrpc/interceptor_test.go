package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemgrpc"
	"github.com/idemkv/idem/idemtest"
)

func TestFirstCallRunsAndRetryReplays(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	first, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.Equal(t, "pay_1", first.GetValue())
	assert.False(t, replayed(header))

	retry, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.True(t, proto.Equal(first, retry), "the replay is the first answer: %v", retry)
	assert.True(t, replayed(header))
	assert.Equal(t, int64(1), e.runs.Load())

	// The key belongs to a tenant and a method: elsewhere it is new.
	_, header, err = e.call(t, payMethod, "globex", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.False(t, replayed(header))
	_, header, err = e.call(t, refundMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.False(t, replayed(header))
	assert.Equal(t, int64(3), e.runs.Load())
}

func TestDifferentRequestIsRefused(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	_, header, err := e.call(t, payMethod, "acme", payment(t, 43), "k1")
	st := refused(t, err, codes.FailedPrecondition, idem.CodeKeyReuse)
	assert.Nil(t, retryInfo(st))
	assert.False(t, replayed(header))
	assert.Equal(t, int64(1), e.runs.Load())

	e = setup(t, idemgrpc.Options{MismatchCode: codes.InvalidArgument})
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	_, _, err = e.call(t, payMethod, "acme", payment(t, 43), "k1")
	refused(t, err, codes.InvalidArgument, idem.CodeKeyReuse)
}

// block makes the service wait in each call until the test lets it go,
// and says when a call has started.
func block(e *env) (started <-chan struct{}, release func()) {
	in, out := make(chan struct{}, 8), make(chan struct{})
	e.app = func(context.Context, string, *structpb.Struct) (*wrapperspb.StringValue, error) {
		in <- struct{}{}
		<-out
		return wrapperspb.String("done"), nil
	}
	return in, sync.OnceFunc(func() { close(out) })
}

func TestConcurrentDuplicateIsAborted(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	started, release := block(e)
	defer release()
	done := make(chan error, 1)
	go func() {
		_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
		done <- err
	}()
	<-started

	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	st := refused(t, err, codes.Aborted, idem.CodeInProgress)
	ri := retryInfo(st)
	require.NotNil(t, ri, "an in-progress refusal says when to retry")
	assert.Positive(t, ri.GetRetryDelay().AsDuration())

	release()
	require.NoError(t, <-done)
	resp, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.Equal(t, "done", resp.GetValue())
	assert.True(t, replayed(header))
	assert.Equal(t, int64(1), e.runs.Load())
}

// With Wait, a retry that meets the first call in progress gets its
// answer instead of Aborted, whether it arrives before the first call ends
// or after.
func TestWaitGetsTheReplay(t *testing.T) {
	e := setup(t, idemgrpc.Options{Wait: time.Minute})
	started, release := block(e)
	defer release()
	first := make(chan error, 1)
	go func() {
		_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
		first <- err
	}()
	<-started
	type answer struct {
		resp   *wrapperspb.StringValue
		replay bool
		err    error
	}
	second := make(chan answer, 1)
	go func() {
		resp, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
		second <- answer{resp, replayed(header), err}
	}()
	release()
	require.NoError(t, <-first)
	a := <-second
	require.NoError(t, a.err)
	assert.Equal(t, "done", a.resp.GetValue())
	assert.True(t, a.replay)
	assert.Equal(t, int64(1), e.runs.Load())
}

// A client that gives up does not cancel the call: its retry finds the
// finished answer.
func TestClientCancelDoesNotCancelTheCall(t *testing.T) {
	e := setup(t, idemgrpc.Options{Wait: time.Minute})
	started, release := block(e)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, _, err := e.callCtx(ctx, t, payMethod, "acme", payment(t, 42), "k1")
		first <- err
	}()
	<-started
	cancel()
	assert.Equal(t, codes.Canceled, status.Code(<-first))
	release()
	resp, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.Equal(t, "done", resp.GetValue())
	assert.True(t, replayed(header))
	assert.Equal(t, int64(1), e.runs.Load())
}

func TestKeys(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42))
	refused(t, err, codes.InvalidArgument, idem.CodeKeyMissing)
	for _, keys := range [][]string{{""}, {`""`}, {"a.b"}, {"a, b"}, {`"abc`}, {strings.Repeat("a", 256)}, {"a", "b"}} {
		_, _, err := e.call(t, payMethod, "acme", payment(t, 42), keys...)
		refused(t, err, codes.InvalidArgument, idem.CodeKeyInvalid)
	}
	assert.Zero(t, e.runs.Load())

	// The syntax is the HTTP header's: an sf-string names the bare key.
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	_, header, err := e.call(t, payMethod, "acme", payment(t, 42), `"k1";v=1`)
	require.NoError(t, err)
	assert.True(t, replayed(header))
	assert.Equal(t, int64(1), e.runs.Load())
}

// A method not in Options.Required is protected when its call carries a
// key and passes through when it does not.
func TestKeyOptionalMethods(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	for range 2 {
		_, header, err := e.call(t, refundMethod, "", payment(t, 42))
		require.NoError(t, err, "no key, no tenant needed")
		assert.False(t, replayed(header))
	}
	assert.Equal(t, int64(2), e.runs.Load())
	for range 2 {
		_, _, err := e.call(t, refundMethod, "acme", payment(t, 42), "r1")
		require.NoError(t, err)
	}
	assert.Equal(t, int64(3), e.runs.Load())
	_, _, err := e.call(t, refundMethod, "acme", payment(t, 42), "a.b")
	refused(t, err, codes.InvalidArgument, idem.CodeKeyInvalid)
}

func TestTenantMissing(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	_, _, err := e.call(t, payMethod, "", payment(t, 42), "k1")
	refused(t, err, codes.Unauthenticated, idem.CodeTenantMissing)
	_, _, err = e.call(t, payMethod, strings.Repeat("t", idem.MaxTenantBytes+1), payment(t, 42), "k1")
	refused(t, err, codes.Unauthenticated, idem.CodeTenantMissing)
	assert.Zero(t, e.runs.Load())
}

func TestHandlerErrors(t *testing.T) {
	detailed, err := status.New(codes.InvalidArgument, "amount must be positive").
		WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount"}}})
	require.NoError(t, err)
	tests := []struct {
		name    string
		err     error
		outcome func(string, error) idemgrpc.Outcome
		// want is how the retry is answered: the stored status, a second
		// run (released), or outcome_pending (unknown).
		want string
	}{
		{"status is stored", detailed.Err(), nil, "stored"},
		{"unavailable is stored", status.Error(codes.Unavailable, "downstream is down"), nil, "stored"},
		{"no effect is released", idemgrpc.NoEffect(status.Error(codes.Unavailable, "downstream is down")), nil, "released"},
		{"idem.ErrNoEffect is released", errors.Join(idem.ErrNoEffect, status.Error(codes.ResourceExhausted, "quota")), nil, "released"},
		{"an error without a status is unknown", errors.New("boom"), nil, "unknown"},
		{"deadline exceeded is unknown", status.Error(codes.DeadlineExceeded, "downstream timed out"), nil, "unknown"},
		{"context canceled is unknown", context.Canceled, nil, "unknown"},
		{"a policy releases", status.Error(codes.Unavailable, "shed"), func(m string, err error) idemgrpc.Outcome {
			if m == payMethod && status.Code(err) == codes.Unavailable {
				return idemgrpc.OutcomeRelease
			}
			return idemgrpc.DefaultOutcome(m, err)
		}, "released"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := setup(t, idemgrpc.Options{Outcome: tt.outcome})
			e.app = func(context.Context, string, *structpb.Struct) (*wrapperspb.StringValue, error) { return nil, tt.err }
			_, _, first := e.call(t, payMethod, "acme", payment(t, 42), "k1")
			require.Error(t, first)
			want := status.Convert(first)
			_, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
			switch tt.want {
			case "stored":
				assert.True(t, proto.Equal(want.Proto(), status.Convert(err).Proto()), "the replay is the first status: %v", err)
				assert.True(t, replayed(header))
				assert.Equal(t, int64(1), e.runs.Load())
			case "released":
				assert.Equal(t, want.Code(), status.Code(err))
				assert.False(t, replayed(header))
				assert.Equal(t, int64(2), e.runs.Load())
			case "unknown":
				refused(t, err, codes.FailedPrecondition, idem.CodeOutcomePending)
				assert.Equal(t, int64(1), e.runs.Load())
				rec, err := e.store.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: payMethod, Key: "k1"})
				require.NoError(t, err)
				assert.Equal(t, idem.StateUnknown, rec.State)
			}
		})
	}
}

func TestPanicRecordsUnknown(t *testing.T) {
	e := setup(t, idemgrpc.Options{})
	e.app = func(context.Context, string, *structpb.Struct) (*wrapperspb.StringValue, error) {
		panic("charged, then crashed")
	}
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	assert.Equal(t, codes.Internal, status.Code(err), "the panic reached the outer interceptor")
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k1")
	refused(t, err, codes.FailedPrecondition, idem.CodeOutcomePending)
	assert.Equal(t, int64(1), e.runs.Load())
	rec, err := e.store.Get(context.Background(), idem.Scope{Tenant: "acme", Endpoint: payMethod, Key: "k1"})
	require.NoError(t, err)
	assert.Equal(t, idem.StateUnknown, rec.State)
}

func TestStoreDown(t *testing.T) {
	store := memStore(t, nil)
	e := setup(t, idemgrpc.Options{Store: store})
	require.NoError(t, store.Close())
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	st := refused(t, err, codes.Unavailable, idem.CodeStoreUnavailable)
	require.NotNil(t, retryInfo(st))
	assert.Zero(t, e.runs.Load(), "nothing runs without a claim")
}

// TestClaimRateIsResourceExhausted: a new key over idem.Limit's rate is
// refused with ResourceExhausted rate_limited and a retry delay, and runs
// nothing, while a retry of the stored call replays.
func TestClaimRateIsResourceExhausted(t *testing.T) {
	store, err := idem.Limit(memStore(t, nil), idem.Limits{ClaimRate: 0.001})
	require.NoError(t, err)
	e := setup(t, idemgrpc.Options{Store: store})
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k2")
	st := refused(t, err, codes.ResourceExhausted, idem.CodeRateLimited)
	require.NotNil(t, retryInfo(st))
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err, "the retry replays")
	assert.Equal(t, int64(1), e.runs.Load())
}

// failingComplete is a store whose leases cannot record a completion.
type failingComplete struct{ idem.Store }

func (s failingComplete) Claim(ctx context.Context, sc idem.Scope, fp idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	l, rec, err := s.Store.Claim(ctx, sc, fp)
	if l != nil {
		l = failingLease{l}
	}
	return l, rec, err
}

type failingLease struct{ idem.Lease }

func (failingLease) Complete(context.Context, idem.Response) error {
	return errors.New("disk full")
}

// An answer that could not be stored is not sent: the retry must be able
// to get back whatever the client holds. The retry never runs it again.
func TestOutcomeNotStored(t *testing.T) {
	e := setup(t, idemgrpc.Options{Store: failingComplete{memStore(t, nil)}})
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	st := refused(t, err, codes.Unavailable, idem.CodeStoreUnavailable)
	assert.Contains(t, st.Message(), "ran")
	_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k1")
	refused(t, err, codes.Aborted, idem.CodeInProgress)
	assert.Equal(t, int64(1), e.runs.Load())
}

func TestAnswerTooLargeToKeep(t *testing.T) {
	e := setup(t, idemgrpc.Options{Store: memStore(t, &idemtest.MemOptions{MaxBodyBytes: 8})})
	e.app = func(context.Context, string, *structpb.Struct) (*wrapperspb.StringValue, error) {
		return wrapperspb.String(strings.Repeat("x", 64)), nil
	}
	resp, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	require.NoError(t, err)
	assert.Len(t, resp.GetValue(), 64)
	_, header, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	st := refused(t, err, codes.FailedPrecondition, idem.CodeResponseBodyOmitted)
	assert.Equal(t, "OK", errorInfo(st).GetMetadata()["original_code"])
	assert.True(t, replayed(header), "the answer is for a call that ran")
	assert.Equal(t, int64(1), e.runs.Load())
}

// replaying is a store whose every claim replays rec.
type replaying struct {
	idem.Store
	rec *idem.Record
}

func (s replaying) Claim(context.Context, idem.Scope, idem.Fingerprint) (idem.Lease, *idem.Record, error) {
	return nil, s.rec, nil
}

// A stored answer whose type this binary does not link cannot be rebuilt:
// the retry gets Internal, and nothing runs.
func TestReplayOfAnUnknownType(t *testing.T) {
	rec := &idem.Record{State: idem.StateCompleted, Response: idem.Response{Status: 200,
		Header: map[string][]string{"Grpc-Status": {"0"}, "Grpc-Message-Type": {"test.Gone"}}}}
	e := setup(t, idemgrpc.Options{Store: replaying{memStore(t, nil), rec}})
	_, _, err := e.call(t, payMethod, "acme", payment(t, 42), "k1")
	assert.Equal(t, codes.Internal, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "test.Gone")
	assert.Zero(t, e.runs.Load())
}

func TestOptionsValidation(t *testing.T) {
	_, err := idemgrpc.UnaryServerInterceptor(idemgrpc.Options{
		Required:     []string{payMethod, "Pay", "/test.Payments/", "//Pay", "/a/b/c"},
		Wait:         -time.Second,
		MismatchCode: 99,
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, idem.ErrInvalidOptions)
	msg := err.Error()
	for _, want := range []string{"Store", "Tenant", `"Pay"`, `"/test.Payments/"`, `"//Pay"`, `"/a/b/c"`, "Wait", "MismatchCode"} {
		assert.Contains(t, msg, want)
	}
	assert.NotContains(t, msg, `"`+payMethod+`"`)
	for _, line := range strings.Split(msg, "\n") {
		assert.True(t, strings.HasPrefix(line, "idem: invalid options: idemgrpc: "), line)
	}
}

// TestOverdueClaimAnswer: a retry that finds a claim past its lease is told
// to come back when a reconciler settles such claims, and that an operator
// must resolve it when none does; unknown records always need the operator.
func TestOverdueClaimAnswer(t *testing.T) {
	for _, c := range []struct {
		name    string
		every   time.Duration
		code    codes.Code
		reason  string
		contain string
	}{
		{"no reconciler", 0, codes.FailedPrecondition, idem.CodeOutcomePending,
			"stopped before its outcome was recorded, so it may or may not have taken effect; " +
				"every retry with this key gets this answer until the service's operator resolves it (idem resolve)"},
		{"reconciler", time.Minute, codes.Aborted, idem.CodeInProgress,
			"the service is finding out what became of it; retry with the same key later"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := idemtest.NewClock()
			mo := &idemtest.MemOptions{Now: clock.Now, ReconcileEvery: c.every}
			if c.every > 0 {
				mo.Reconcile = func(context.Context, idem.Lease) error { return nil }
			}
			store := memStore(t, mo)
			crashed := setup(t, idemgrpc.Options{Store: idemtest.Forgetful(store)})
			_, _, err := crashed.call(t, payMethod, "acme", payment(t, 42), "k")
			require.NoError(t, err)

			e := setup(t, idemgrpc.Options{Store: store})
			clock.Advance(time.Hour) // past the lease, within the TTL
			_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "k")
			st := refused(t, err, c.code, c.reason)
			assert.Contains(t, st.Message(), c.contain)
			assert.NotContains(t, st.Message(), "reconcil", "the message names no mechanism the client cannot see")
			if ri := retryInfo(st); c.every > 0 && assert.NotNil(t, ri) {
				assert.Equal(t, c.every, ri.GetRetryDelay().AsDuration())
			} else {
				assert.Nil(t, ri)
			}
			assert.Zero(t, e.runs.Load(), "an overdue claim is never re-run blindly")

			// An unknown record: only an operator settles it, reconciler
			// or not.
			e.app = func(context.Context, string, *structpb.Struct) (*wrapperspb.StringValue, error) {
				return nil, errors.New("the bank did not answer")
			}
			e.call(t, payMethod, "acme", payment(t, 42), "u")
			_, _, err = e.call(t, payMethod, "acme", payment(t, 42), "u")
			st = refused(t, err, codes.FailedPrecondition, idem.CodeOutcomePending)
			assert.Contains(t, st.Message(), "may or may not have taken effect")
			assert.Nil(t, retryInfo(st))
		})
	}
}
