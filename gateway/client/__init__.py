"""The client library: Subscriber, AsyncSubscriber, Publisher, ReplayClient (re-exported by `gateway`)."""
