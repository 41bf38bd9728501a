"""Process lifecycle: launching engine servers and cleaning up what they leave in /dev/shm."""
