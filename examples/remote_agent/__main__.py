from examples.remote_agent.agent import main

main()
