package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInfoField(t *testing.T) {
	info := "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_current_size:123456\r\naof_base_size:100\r\n"
	n, err := infoField(info, "aof_current_size")
	require.NoError(t, err)
	assert.Equal(t, uint64(123456), n)
	_, err = infoField(info, "aof_rewrite_buffer_length")
	assert.Error(t, err)
	_, err = infoField("aof_current_size:x\r\n", "aof_current_size")
	assert.Error(t, err)
}

func TestOnThisMachine(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1":           true,
		"::1":                 true,
		"localhost":           true,
		"/var/run/postgresql": true,
		"10.0.0.5":            false,
		"db.example.com":      false,
	} {
		assert.Equal(t, want, onThisMachine(host), host)
	}
}

func TestUsesPG(t *testing.T) {
	for name, want := range map[string]bool{"postgres": true, "pgstore": true, "proxy-pg-2": true, "idem-proxy": false, "redis": false} {
		assert.Equal(t, want, usesPG(name), name)
	}
}
