package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemgrpc"
	"github.com/idemkv/idem/idemtest"
)

// The test service has two methods that take a structpb.Struct and answer
// a wrapperspb.StringValue: Pay must carry a key, Refund may.
const (
	payMethod    = "/test.Payments/Pay"
	refundMethod = "/test.Payments/Refund"
)

// env is an in-process gRPC server behind the interceptor, over bufconn,
// and a client connected to it.
type env struct {
	store idem.Store
	conn  *grpc.ClientConn
	runs  atomic.Int64
	// app answers each call that reaches the service; it runs after runs
	// is counted.
	app func(ctx context.Context, method string, req *structpb.Struct) (*wrapperspb.StringValue, error)
}

// setup serves the test service with the interceptor configured by o,
// whose Store defaults to a new MemStore and Tenant to the caller's
// "authorization" metadata.
func memStore(t *testing.T, o *idemtest.MemOptions) *idemtest.MemStore {
	t.Helper()
	m, err := idemtest.NewMemStore(o)
	require.NoError(t, err)
	return m
}

func setup(t *testing.T, o idemgrpc.Options) *env {
	t.Helper()
	if o.Store == nil {
		o.Store = memStore(t, nil)
	}
	if o.Tenant == nil {
		o.Tenant = tenantFromMetadata
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Required == nil {
		o.Required = []string{payMethod}
	}
	e := &env{store: o.Store}
	e.app = func(context.Context, string, *structpb.Struct) (*wrapperspb.StringValue, error) {
		return wrapperspb.String(fmt.Sprintf("pay_%d", e.runs.Load())), nil
	}
	ic, err := idemgrpc.UnaryServerInterceptor(o)
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverPanics, ic))
	srv.RegisterService(e.serviceDesc(), struct{}{})
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	e.conn, err = grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { e.conn.Close() })
	return e
}

func tenantFromMetadata(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 {
		return v[0], nil
	}
	return "", errors.New("no credentials")
}

// recoverPanics stands in for the recovery interceptor a real server
// installs outside idemgrpc's: grpc-go lets a handler's panic end the
// process.
func recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return handler(ctx, req)
}

func (e *env) serviceDesc() *grpc.ServiceDesc {
	method := func(name string) grpc.MethodDesc {
		full := "/test.Payments/" + name
		return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				e.runs.Add(1)
				return e.app(ctx, full, req.(*structpb.Struct))
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
		}}
	}
	return &grpc.ServiceDesc{
		ServiceName: "test.Payments",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{method("Pay"), method("Refund")},
		Metadata:    "test.proto",
	}
}

// call invokes method as tenant with the given keys (none, one, or
// several values) and returns the answer and the response header.
func (e *env) call(t *testing.T, method, tenant string, req *structpb.Struct, keys ...string) (*wrapperspb.StringValue, metadata.MD, error) {
	return e.callCtx(context.Background(), t, method, tenant, req, keys...)
}

func (e *env) callCtx(ctx context.Context, t *testing.T, method, tenant string, req *structpb.Struct, keys ...string) (*wrapperspb.StringValue, metadata.MD, error) {
	t.Helper()
	md := metadata.MD{}
	if tenant != "" {
		md.Set("authorization", tenant)
	}
	for _, k := range keys {
		md.Append(idemgrpc.MetadataKey, k)
	}
	resp := new(wrapperspb.StringValue)
	var header metadata.MD
	err := e.conn.Invoke(metadata.NewOutgoingContext(ctx, md), method, req, resp, grpc.Header(&header))
	if err != nil {
		return nil, header, err
	}
	return resp, header, nil
}

// payment is a request body; amount varies it.
func payment(t *testing.T, amount float64) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{"amount": amount, "currency": "eur", "meta": map[string]any{"a": 1, "b": 2}})
	require.NoError(t, err)
	return s
}

// refused asserts that err is a refusal with code c and reason, and
// returns its status.
func refused(t *testing.T, err error, c codes.Code, reason string) *status.Status {
	t.Helper()
	require.Error(t, err)
	st := status.Convert(err)
	assert.Equal(t, c, st.Code(), st.Message())
	info := errorInfo(st)
	require.NotNil(t, info, "the refusal carries an ErrorInfo")
	assert.Equal(t, reason, info.GetReason())
	assert.Equal(t, idemgrpc.DefaultDomain, info.GetDomain())
	return st
}

func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func retryInfo(st *status.Status) *errdetails.RetryInfo {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	return nil
}

func replayed(md metadata.MD) bool {
	v := md.Get(idemgrpc.MetadataReplayed)
	return len(v) == 1 && v[0] == "true"
}
