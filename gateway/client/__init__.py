"""The client library: Subscriber, AsyncSubscriber, Publisher, AsyncPublisher, ReplayClient (all in `gateway`)."""
