package main

import (
	"context"
	"errors"
	"io"
)

// runRouter is not built yet; its issue delivers it.
func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("router: not built yet")
}
