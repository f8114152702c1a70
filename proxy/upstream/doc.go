// Package upstream is how a router reaches replicas and peer routers: the
// http.Client it dials them with (NewClient: receive buffers, connections
// marked for the hop protocol), its own HTTP/1.1 client for plain-HTTP
// replicas (Client), raw system calls on non-blocking sockets (SockIO),
// the epoll stream loop that relays SSE streams socket to socket (Loops),
// the watch that ends a response whose upstream went silent (IdleWatch)
// and the SSE event framing a relay keeps so that a failure can end a
// stream with an error event (Framing).
package upstream
