package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// redisSystem is the common Redis recipe made durable: the claim is
// SET NX PX (24 hours) of "fingerprint|in_progress", the completion a
// SET XX KEEPTTL of the completed value with the response, and the server
// must append every write to its AOF with appendfsync always, or an
// acknowledged claim could vanish in a crash and the comparison would be
// with a cache, not a store. Redis shares one fsync between the writes of
// an event-loop iteration.
type redisSystem struct {
	c      *redis.Client
	prefix string // this run's keys, removed at the end
}

func openRedis(e env) (system, error) {
	if e.redisAddr == "" {
		return nil, errors.New("needs -redis ADDR")
	}
	c := redis.NewClient(&redis.Options{Addr: e.redisAddr, PoolSize: e.maxConc, MinIdleConns: 1})
	ctx := context.Background()
	for param, want := range map[string]string{"appendonly": "yes", "appendfsync": "always"} {
		got, err := c.ConfigGet(ctx, param).Result()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("CONFIG GET %s: %w", param, err)
		}
		if got[param] != want {
			c.Close()
			return nil, fmt.Errorf("the server has %s %q, not %q: its writes would not be durable when acknowledged, so it is not measured", param, got[param], want)
		}
	}
	return &redisSystem{c: c, prefix: "idem-bench:" + uuid.NewString()[:8] + ":"}, nil
}

func (s *redisSystem) key(o op) string {
	return s.prefix + o.tenant + ":" + endpoint + ":" + o.key
}

// Values are the 32-byte fingerprint, a separator and the state; a
// completed value goes on with the status and the body.
func (s *redisSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	k := s.key(o)
	claimed := append(append(o.fp[:0:0], o.fp[:]...), "|in_progress"...)
	ok, err := s.c.Do(ctx, "SET", k, claimed, "NX", "PX", 86400000).Result()
	if errors.Is(err, redis.Nil) {
		return errors.New("bench: key exists")
	}
	if err != nil {
		return err
	}
	if ok != "OK" {
		return fmt.Errorf("bench: SET NX answered %v", ok)
	}
	done := append(append(append(o.fp[:0:0], o.fp[:]...), "|completed|201|"...), body...)
	_, err = s.c.Do(ctx, "SET", k, done, "XX", "KEEPTTL").Result()
	if errors.Is(err, redis.Nil) {
		return errors.New("bench: the claim vanished before its completion")
	}
	return err
}

func (s *redisSystem) replay(ctx context.Context, o op) ([]byte, error) {
	v, err := s.c.Get(ctx, s.key(o)).Bytes()
	if err != nil {
		return nil, err
	}
	rest, ok := bytes.CutPrefix(v, o.fp[:])
	if !ok {
		return nil, errors.New("bench: replay found another fingerprint")
	}
	rest, ok = bytes.CutPrefix(rest, []byte("|completed|"))
	if !ok {
		return nil, errors.New("bench: replay found the key not completed")
	}
	status, body, ok := bytes.Cut(rest, []byte("|"))
	if n, err := strconv.Atoi(string(status)); !ok || err != nil || n != 201 {
		return nil, fmt.Errorf("bench: replay found status %q", status)
	}
	return body, nil
}

func (s *redisSystem) syncsPerOp() float64 { return 0 }

// close removes this run's keys, in batches, so that a shared server is
// left as it was found.
func (s *redisSystem) close() error {
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := s.c.Scan(ctx, cursor, s.prefix+"*", 10000).Result()
		if err != nil {
			s.c.Close()
			return err
		}
		if len(keys) > 0 {
			if err := s.c.Unlink(ctx, keys...).Err(); err != nil {
				s.c.Close()
				return err
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	return s.c.Close()
}
