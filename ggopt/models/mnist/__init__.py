"""ggml's MNIST models (fully connected and convolutional) and data: the models the MNIST
command line trains and the tests use as a fixture."""
