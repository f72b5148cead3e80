// Command upstream runs crashtest.Upstream as a process of its own, so that
// the executions it journals outlive every kill of the proxy in front of it.
// It prints "upstream: listening on http://ADDR" once it accepts requests,
// and runs until it is signalled.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkv/idem/internal/crashtest"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	journal := flag.String("journal", "", "file to append executions to (required)")
	maxDelay := flag.Duration("max-delay", 0, "longest random pause before answering")
	flag.Parse()
	if *journal == "" {
		log.Fatal("upstream: --journal is required")
	}
	j, err := crashtest.OpenJournal(*journal)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	srv := &http.Server{Handler: crashtest.NewUpstream(j, *maxDelay), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		srv.Close()
	}()
	fmt.Printf("upstream: listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		log.Fatalf("upstream: %v", err)
	}
	if err := j.Close(); err != nil {
		log.Fatalf("upstream: %v", err)
	}
}
