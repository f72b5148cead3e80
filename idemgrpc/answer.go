package idemgrpc

import (
	"fmt"
	"net/http"
	"strconv"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkv/idem"
)

// A stored answer is a idem.Response laid out as gRPC sends one over
// HTTP/2: status 200, the gRPC code in Grpc-Status, and a body that is the
// response message (its full type name in Grpc-Message-Type) when the code
// is OK, and the google.rpc.Status with the message and details otherwise.
const (
	headerStatus      = "Grpc-Status"
	headerMessageType = "Grpc-Message-Type"
)

var marshal = proto.MarshalOptions{Deterministic: true}

// encode lays out the handler's answer for the store: resp when herr is
// nil, herr's status otherwise.
func encode(resp any, herr error) (idem.Response, error) {
	if herr != nil {
		st := statusOf(herr)
		body, err := marshal.Marshal(st.Proto())
		if err != nil {
			return idem.Response{}, err
		}
		return idem.Response{Status: http.StatusOK,
			Header: http.Header{headerStatus: {strconv.Itoa(int(st.Code()))}}, Body: body}, nil
	}
	msg, ok := resp.(proto.Message)
	if !ok {
		return idem.Response{}, fmt.Errorf("the handler answered a %T, not a protocol buffer message", resp)
	}
	body, err := marshal.Marshal(msg)
	if err != nil {
		return idem.Response{}, err
	}
	return idem.Response{Status: http.StatusOK, Header: http.Header{
		headerStatus:      {"0"},
		headerMessageType: {string(msg.ProtoReflect().Descriptor().FullName())},
	}, Body: body}, nil
}

// storedCode returns the gRPC code of a stored answer.
func storedCode(r idem.Response) (codes.Code, error) {
	c, err := strconv.ParseUint(r.Header.Get(headerStatus), 10, 32)
	return codes.Code(c), err
}

// originalCode names the gRPC code of a stored answer ("OK",
// "InvalidArgument"), for a refusal that cannot send the answer itself.
func originalCode(r idem.Response) string {
	c, err := storedCode(r)
	if err != nil {
		return codes.Unknown.String()
	}
	return c.String()
}

// decode rebuilds a stored answer: a new message of the stored type, or
// the stored status as an error. An answer that cannot be rebuilt is an
// Internal error, which every retry meets again.
func decode(rec *idem.Record) (any, error) {
	r := rec.Response
	broken := func(err error) error {
		return status.Errorf(codes.Internal, "idemgrpc: the stored answer of %s cannot be rebuilt: %v", rec.Scope.Endpoint, err)
	}
	c, err := storedCode(r)
	if err != nil {
		return nil, broken(err)
	}
	if c != codes.OK {
		st := new(spb.Status)
		if err := proto.Unmarshal(r.Body, st); err != nil {
			return nil, broken(err)
		}
		return nil, status.FromProto(st).Err()
	}
	name := r.Header.Get(headerMessageType)
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return nil, broken(fmt.Errorf("message type %q: %w", name, err))
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(r.Body, msg); err != nil {
		return nil, broken(err)
	}
	return msg, nil
}
