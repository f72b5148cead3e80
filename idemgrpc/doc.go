// Package idemgrpc puts idem's idempotency contract in front of gRPC unary
// methods: a call that carries an idempotency-key in its metadata runs once,
// its answer is stored durably, and every retry gets that answer again,
// marked by the response header idempotent-replayed: true.
//
// # Basics
//
// UnaryServerInterceptor returns the interceptor; install it with
// grpc.ChainUnaryInterceptor. Options.Store keeps the records (the embedded
// store that pebblestore.Open opens, or any other idem.Store) and
// Options.Tenant names the caller that keys are scoped by. A key is the
// value of the metadata field idempotency-key, with the syntax of the HTTP
// header (idem.ParseKey): a bare token or an RFC 8941 sf-string of 1 to
// 255 characters of A-Z, a-z, 0-9, '_' and '-'. A key is scoped by tenant,
// endpoint and key, where the endpoint is the full method name
// ("/pkg.Service/Method").
//
// Every unary method is protected when its call carries a key; the methods
// in Options.Required must carry one. Streaming methods are not covered.
//
// # The fingerprint
//
// A key belongs to one request: Fingerprint hashes the full method name and
// the request message's deterministic protobuf encoding
// (proto.MarshalOptions{Deterministic: true}), and a retry with another
// fingerprint is refused. That encoding is the canonical form, and it has
// limits. It sorts map entries, but protobuf does not promise that it is
// stable across versions of the protobuf runtime or of the generated code,
// so a retry that straddles such an upgrade may be refused as a different
// request (never run twice). A field at its default value without explicit
// presence is not encoded, so sending it and leaving it out are one
// request; unknown fields are hashed as they arrived. Nothing is left out:
// a field that changes between retries of one operation (a client
// timestamp, a trace ID) makes the retry a different request, so send such
// values in metadata instead.
//
// # Answers
//
// What is stored and replayed is the handler's answer: the response
// message, or the error's status with its code, message and details. A
// replay rebuilds the message in the type named when it was stored,
// resolved through protoregistry.GlobalTypes, where every generated type
// registers itself; metadata the handler set is not stored. idem's tools
// show a stored answer as gRPC sends one over HTTP/2: status 200, with the
// gRPC code in a Grpc-Status header.
//
// A handler error is judged by Options.Outcome, DefaultOutcome unless set:
//   - an error that matches idem.ErrNoEffect (see NoEffect) says that
//     nothing was committed: the key is released and a retry runs the
//     handler again;
//   - Unknown (every error without a gRPC status), Canceled and
//     DeadlineExceeded say that the handler does not know what happened:
//     the record becomes unknown, and retries get outcome_pending until a
//     reconciler or an operator resolves it;
//   - any other status is the handler's answer and is stored and replayed,
//     Unavailable and ResourceExhausted included: a code alone does not
//     prove that nothing was committed. Release them in your own Outcome
//     for the methods that return them only before they change anything.
//
// A handler that panics, or ends its goroutine, may have done anything: its
// record becomes unknown and the panic goes on. The handler runs on a
// context that the client's cancellation does not reach, so a client that
// gives up finds the finished answer when it retries.
//
// # Refusals
//
// Every refusal is a status with an errdetails.ErrorInfo whose Reason is
// the contract's problem code (the code of the HTTP problem documents) and
// whose Domain is Options.Domain:
//
//	situation                            code                 reason                   retry
//	key missing on a required method     InvalidArgument      idempotency_key_missing  no
//	key malformed, or sent twice         InvalidArgument      idempotency_key_invalid  no
//	Options.Tenant fails                 Unauthenticated      tenant_missing           no
//	the key's first call still runs      Aborted + RetryInfo  request_in_progress      yes, same key, after the delay
//	the key was used for another request FailedPrecondition   idempotency_key_reuse    no, a new key for a new operation
//	an earlier attempt failed or is      FailedPrecondition   outcome_pending          no, until it is resolved
//	unknown, or its lease ran out
//	a lease ran out and a reconciler     Aborted + RetryInfo  request_in_progress      yes, same key, after
//	is at work (KeyError.Reconciling)                                                  its next pass
//	the stored response was too large    FailedPrecondition   response_body_omitted    no: it ran, a new key runs it again
//	to keep (original_code in metadata)
//	the store fails the claim            Unavailable +        store_unavailable        yes, same key: nothing ran
//	                                     RetryInfo
//	the server's clock is behind the     Unavailable +        clock_behind             yes, same key, after the delay
//	store's newest time                  RetryInfo
//	a new key over idem.Limit's rate,    ResourceExhausted +  rate_limited, store_full yes, same key, after the delay
//	or the store over its size bound     RetryInfo
//	the call ran, its outcome was not    Unavailable +        store_unavailable        yes, same key: it will not run twice
//	stored                               RetryInfo
//
// FailedPrecondition marks a key reused with another request because the
// refusal depends on what the store holds, not on the request alone, as
// gRPC's guide separates it from InvalidArgument; Options.MismatchCode
// changes it. Refusals carry no idempotent-replayed header, except
// response_body_omitted, which answers for a call that ran.
package idemgrpc
