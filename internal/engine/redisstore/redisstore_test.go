package redisstore_test

import (
	"testing"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testredis"
)

func TestConformance(t *testing.T) {
	srv := testredis.Start(t)
	enginetest.Run(t, func(t *testing.T) engine.Store {
		s, err := redisstore.Open(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
