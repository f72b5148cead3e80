package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkv/idem"
)

// Metadata fields of the contract over gRPC.
const (
	// MetadataKey carries the idempotency key in the request metadata.
	MetadataKey = "idempotency-key"
	// MetadataReplayed is "true" in the response header of an answer
	// replayed from the store instead of run again.
	MetadataReplayed = "idempotent-replayed"
)

// DefaultDomain is the ErrorInfo domain of every refusal unless
// Options.Domain says otherwise.
const DefaultDomain = "github.com/idemkv/idem"

// Options configure the interceptor. Store and Tenant are required; every
// other zero value selects the default given in its comment.
type Options struct {
	// Store keeps the records: the embedded store (pebblestore.Open) or any
	// other backend of the contract. Required.
	Store idem.Store

	// Tenant returns the authenticated caller a call belongs to, from its
	// metadata or its credentials (peer.FromContext): keys are scoped by
	// it, so one tenant can never see another's answers. An error refuses
	// the call with Unauthenticated. A service whose callers may share
	// answers returns "" for all of them, and so says that it means it.
	// Required.
	Tenant func(ctx context.Context) (string, error)

	// Required lists the full method names ("/pkg.Service/Method") whose
	// calls must carry a key. A call of any other unary method is
	// protected when it carries a key and passes straight through when it
	// does not. Default: none.
	Required []string

	// Wait is how long a retry that finds its key in progress waits for
	// the first call to finish before it is refused with Aborted. The
	// first call's end wakes it, and the retry then gets the replay.
	// Default: 0, refuse at once.
	Wait time.Duration

	// MismatchCode is the code for a key reused with another request.
	// Default: codes.FailedPrecondition.
	MismatchCode codes.Code

	// Outcome decides what becomes of a key whose handler returned an
	// error. Default: DefaultOutcome.
	Outcome func(fullMethod string, err error) Outcome

	// Domain is the ErrorInfo domain of every refusal. Default:
	// DefaultDomain.
	Domain string

	// Logger receives failures to claim and to store outcomes.
	// Default: slog.Default().
	Logger *slog.Logger
}

// Outcome is what becomes of a key whose handler returned an error.
type Outcome uint8

const (
	// OutcomeStore keeps the error's status as the answer: every retry
	// gets it again.
	OutcomeStore Outcome = iota + 1
	// OutcomeRelease frees the key: nothing was committed, and a retry
	// runs the handler again.
	OutcomeRelease
	// OutcomeUnknown records that the operation may have taken effect:
	// retries are refused with outcome_pending until someone resolves it.
	OutcomeUnknown
)

// DefaultOutcome releases the key after an error that matches
// idem.ErrNoEffect, records unknown after Unknown, Canceled and
// DeadlineExceeded (and any error without a status, which gRPC sends as
// Unknown), and stores every other status as the answer.
func DefaultOutcome(fullMethod string, err error) Outcome {
	if errors.Is(err, idem.ErrNoEffect) {
		return OutcomeRelease
	}
	switch statusOf(err).Code() {
	case codes.Unknown, codes.Canceled, codes.DeadlineExceeded:
		return OutcomeUnknown
	}
	return OutcomeStore
}

// NoEffect marks err, a handler's error, as one after which the operation
// provably took no effect (it failed a check before changing anything), so
// that DefaultOutcome releases the key. The client still gets err's status.
func NoEffect(err error) error { return noEffect{err} }

type noEffect struct{ err error }

func (e noEffect) Error() string              { return e.err.Error() }
func (e noEffect) Unwrap() []error            { return []error{e.err, idem.ErrNoEffect} }
func (e noEffect) GRPCStatus() *status.Status { return statusOf(e.err) }

// statusOf returns err's status as the gRPC server sends it.
func statusOf(err error) *status.Status {
	if s, ok := status.FromError(err); ok {
		return s
	}
	return status.FromContextError(err)
}

// interceptor is the validated configuration behind the interceptor.
type interceptor struct {
	opts     Options
	required map[string]bool
	do       *idem.DoOptions
}

// UnaryServerInterceptor validates o and returns the interceptor. Install
// it with grpc.ChainUnaryInterceptor, after the interceptors that
// authenticate the caller, since Options.Tenant reads what they found.
func UnaryServerInterceptor(o Options) (grpc.UnaryServerInterceptor, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: idemgrpc: "+format, append([]any{idem.ErrInvalidOptions}, args...)...))
	}
	if o.Store == nil {
		bad("Options.Store is required")
	}
	if o.Tenant == nil {
		bad("Options.Tenant is required: keys must be scoped by the authenticated caller")
	}
	m := &interceptor{required: map[string]bool{}}
	for _, name := range o.Required {
		if !isFullMethod(name) {
			bad("Options.Required: %q is not a full method name (/pkg.Service/Method)", name)
		}
		m.required[name] = true
	}
	if o.Wait < 0 {
		bad("Options.Wait %s must not be negative", o.Wait)
	}
	if o.MismatchCode == codes.OK {
		o.MismatchCode = codes.FailedPrecondition
	}
	if o.MismatchCode > codes.Unauthenticated {
		bad("Options.MismatchCode %d is not a gRPC code", o.MismatchCode)
	}
	if o.Outcome == nil {
		o.Outcome = DefaultOutcome
	}
	if o.Domain == "" {
		o.Domain = DefaultDomain
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	m.opts = o
	m.do = &idem.DoOptions{Wait: o.Wait, Logger: o.Logger}
	return m.intercept, nil
}

// isFullMethod reports whether name has the form of a full method name,
// "/pkg.Service/Method", as grpc.UnaryServerInfo spells it.
func isFullMethod(name string) bool {
	rest, ok := strings.CutPrefix(name, "/")
	svc, meth, _ := strings.Cut(rest, "/")
	return ok && svc != "" && meth != "" && !strings.Contains(meth, "/")
}

func (m *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	keys := md.Get(MetadataKey)
	if len(keys) == 0 && !m.required[info.FullMethod] {
		return handler(ctx, req)
	}
	switch {
	case len(keys) == 0:
		return nil, m.problem(codes.InvalidArgument, idem.CodeKeyMissing, "no idempotency key", 0, nil)
	case len(keys) > 1:
		return nil, m.problem(codes.InvalidArgument, idem.CodeKeyInvalid, "the idempotency key is sent more than once", 0, nil)
	}
	key, err := idem.ParseKey(keys[0])
	if err != nil {
		return nil, m.problem(codes.InvalidArgument, idem.CodeKeyInvalid, err.Error(), 0, nil)
	}
	tenant, err := m.opts.Tenant(ctx)
	if err != nil {
		m.opts.Logger.Debug("idemgrpc: Options.Tenant refused the call", "err", err)
		return nil, m.refuse(idem.ErrNoTenant)
	}
	if len(tenant) > idem.MaxTenantBytes {
		// Checked here, not left to the store, so that the client hears
		// about its credential rather than about its key.
		return nil, m.problem(codes.Unauthenticated, idem.CodeTenantMissing,
			fmt.Sprintf("the tenant is %d bytes, more than %d", len(tenant), idem.MaxTenantBytes), 0, nil)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the request of %s is a %T, not a protocol buffer message", info.FullMethod, req)
	}
	fp, err := Fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	scope := idem.Scope{Tenant: tenant, Endpoint: info.FullMethod, Key: key}

	return m.execute(ctx, req, info, handler, scope, fp)
}

// refuse answers a call that did not run, or whose outcome could not be
// stored, in the contract's words.
func (m *interceptor) refuse(err error) error {
	rf := idem.Refuse(err, "call")
	c := codes.Unavailable
	switch rf.Code {
	case idem.CodeKeyReuse:
		c = m.opts.MismatchCode
	case idem.CodeInProgress:
		// A RetryInfo of zero would read as "retry at once, forever".
		c, rf.RetryAfter = codes.Aborted, max(rf.RetryAfter, time.Millisecond)
	case idem.CodeOutcomePending:
		c = codes.FailedPrecondition
	case idem.CodeKeyInvalid:
		c = codes.InvalidArgument
	case idem.CodeTenantMissing:
		c = codes.Unauthenticated
	case idem.CodeRateLimited, idem.CodeStoreFull:
		c = codes.ResourceExhausted
	}
	return m.problem(c, rf.Code, rf.Detail, rf.RetryAfter, nil)
}

// execute runs the handler through idem.Do, which claims the key and
// stores the outcome before the answer leaves: a client must never hold
// an answer that its retries cannot get back.
func (m *interceptor) execute(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, scope idem.Scope, fp idem.Fingerprint) (any, error) {
	// A client that gives up must not cancel the operation: its retry
	// should find the finished answer, not a half-done one.
	keep := context.WithoutCancel(ctx)
	var (
		ran          bool
		resp         any
		herr, encErr error
	)
	res, err := idem.Do(ctx, m.opts.Store, scope, fp, m.do, func(context.Context, idem.Lease) (idem.Response, error) {
		ran = true
		resp, herr = handler(keep, req)
		if herr != nil {
			switch m.opts.Outcome(info.FullMethod, herr) {
			case OutcomeRelease:
				return idem.Response{}, idem.ErrNoEffect
			case OutcomeStore:
			default:
				return idem.Response{}, herr
			}
		}
		answer, err := encode(resp, herr)
		if err != nil {
			// The operation ran, but its answer can be neither kept nor
			// sent.
			encErr = err
			return idem.Response{}, err
		}
		return answer, nil
	})
	switch {
	case res.Replayed != nil:
		return m.replay(ctx, res.Replayed)
	case !ran, errors.Is(err, idem.ErrOutcomeNotStored):
		return nil, m.refuse(err)
	case encErr != nil:
		return nil, status.Errorf(codes.Internal, "idemgrpc: %s: %v", info.FullMethod, encErr)
	}
	return resp, herr
}

// replay answers with the stored answer and marks it replayed.
func (m *interceptor) replay(ctx context.Context, rec *idem.Record) (any, error) {
	// It fails only outside a gRPC server, where there is no header to set.
	_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true"))
	if rec.BodyOmitted {
		return nil, m.problem(codes.FailedPrecondition, idem.CodeResponseBodyOmitted,
			fmt.Sprintf("the call ran, but its answer (%d bytes) was too large to keep, so it cannot be sent again; "+
				"do not repeat the operation under a new key: it would run again", rec.BodyLen),
			0, map[string]string{"original_code": originalCode(rec.Response)})
	}
	return decode(rec)
}

// problem returns a refusal: a status with code c and an ErrorInfo whose
// reason is the contract's problem code, and, when retry is positive, a
// RetryInfo.
func (m *interceptor) problem(c codes.Code, reason, msg string, retry time.Duration, meta map[string]string) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: m.opts.Domain, Metadata: meta}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		// Only an OK code has no room for details, and no refusal is OK.
		panic(err)
	}
	return st.Err()
}
