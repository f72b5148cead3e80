package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkv/idem/idemgrpc"
	"github.com/idemkv/idem/internal/pebblefs"
	"github.com/idemkv/idem/pebblestore"
)

func Example() {
	db, err := pebblestore.Open("idem-data", pebblefs.With(&pebblestore.Options{}, vfs.NewMem())) // a real service: a directory, nil options
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ic, err := idemgrpc.UnaryServerInterceptor(idemgrpc.Options{
		Store: db,
		// Scope keys by the authenticated caller.
		Tenant: func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get("authorization"); len(v) == 1 {
				return v[0], nil
			}
			return "", fmt.Errorf("no credentials")
		},
		Required: []string{"/shop.Payments/Pay"},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic))
	charges := 0
	// A hand-written service; generated code registers its own.
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "shop.Payments",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Pay", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.Int64Value)
			if err := dec(in); err != nil {
				return nil, err
			}
			pay := func(ctx context.Context, req any) (any, error) {
				charges++
				return wrapperspb.String(fmt.Sprintf("pay_%d", charges)), nil
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/shop.Payments/Pay"}, pay)
		}}},
	}, struct{}{})
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///shop",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	pay := func(amount int64) {
		ctx := metadata.AppendToOutgoingContext(context.Background(),
			"authorization", "Bearer sk_test_1", idemgrpc.MetadataKey, "4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90")
		var header metadata.MD
		resp := new(wrapperspb.StringValue)
		if err := conn.Invoke(ctx, "/shop.Payments/Pay", wrapperspb.Int64(amount), resp, grpc.Header(&header)); err != nil {
			st := status.Convert(err)
			fmt.Println(st.Code(), st.Message())
			return
		}
		fmt.Println(resp.GetValue(), header.Get(idemgrpc.MetadataReplayed))
	}
	pay(4200)
	pay(4200) // a retry
	pay(9900) // the same key, another request
	fmt.Println("charges:", charges)
	// Output:
	// pay_1 []
	// pay_1 [true]
	// FailedPrecondition this idempotency key was used for a different call; use a new key for a new operation
	// charges: 1
}
